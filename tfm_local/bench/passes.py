"""The cost of one target verification pass of n tokens, broken down by what is read back.

After a prompt of ``n_prompt`` tokens, each timed pass decodes n tokens appended at the end of the
cache (positions ``n_prompt .. n_prompt + n - 1``, sequence 0) and reads its results; the pass is
then removed again (``llama_memory_seq_rm`` from ``n_prompt``, timed apart as
``remove``), so every pass sees the same cache. The variants (``VARIANTS``):

- ``logits``: ``Target.verify`` — all n rows' logits copied to the host (today's chain verify);
- ``argmax``: ``Target.verify(..., backend_choice=True)`` — each row's top-1 computed in the graph
  (``attach_argmax``), one int per row to the host; skipped when the backend cannot run it;
- ``sample``: ``Target.verify(..., backend_choice=True)`` with the token sampler attached
  (``attach_sampler``, T = 0.7 and top-p 0.95: a chat client's setting): each row's draw made in the
  graph, one int per row to the host; skipped when the backend cannot run it. Random ids make flat
  distributions, so the nucleus is larger than on real text (an upper bound of the op's cost);
- ``logits+argmax_host``: ``Target.verify`` then ``np.argmax`` over all n rows (host greedy mode);
- ``features``: ``Target.verify`` with the drafter's layer-input capture on
  (``Target.set_features``) and ``Target.features`` of all n rows read (a copy);
- ``last_row``: the same n tokens with only the last row an output (``Context.decode_tokens`` with
  "last", as a prefill chunk): the pass without the n-row LM head and logits copy. It also records
  ``submit``: the time until the decode call returns (batch building and ``llama_process``; on a GPU
  the graph is launched but not waited for, on the CPU it is computed), the rest of the pass being
  the wait for the backend (``llama_get_logits`` synchronizes).

Times are wall-clock ms from ``time.perf_counter``; every pass ends with its results on the host.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from .gdn import time_stats
from ..decode.sampling import SamplingParams
from ..decode.verify import Target

VARIANTS = ("logits", "argmax", "sample", "logits+argmax_host", "features", "last_row")
#: the ``sample`` variant's setting
SAMPLE = SamplingParams(temperature=0.7, top_p=0.95)
#: the method in one paragraph, for a result file
METHOD = ("each pass: n random token ids decoded at positions ctx .. ctx+n-1 after a prompt of ctx random ids, "
          "results read to the host, then removed (llama_memory_seq_rm, timed as remove); "
          "logits = Target.verify (all n rows' logits), argmax = Target.verify(backend_choice=True) (top-1 in the graph), "
          "sample = the same with the token sampler (T 0.7, top-p 0.95) drawing in the graph, "
          "logits+argmax_host = verify + np.argmax over all rows, features = verify with the drafter's "
          "layer inputs captured + Target.features of all rows, last_row = only the last row an output "
          "(submit = until the decode call returns; the rest is the wait for the backend); "
          "wall-clock ms, median and min over the timed passes")


def dflash_feature_layers(n_layer: int) -> list[int]:
    """Layer-input indices a DFlash drafter made for an ``n_layer``-layer target reads (5 spread from
    shallow to deep: ``tfm_convert`` ``spread_target_layers`` + 1; [2, 8, 14, 20, 26] for 28 layers,
    as the shipped Qwen2.5-Coder-1.5B drafter). Raises ConvertError for fewer than 2 layers."""
    from tfm_convert.random_init import spread_target_layers

    return [i + 1 for i in spread_target_layers(n_layer)]


class PassBench:
    """A ``Target`` with a prefilled synthetic prompt, timing passes appended after it.

    Args:
        target: a loaded target that can truncate (not a recurrent hybrid), with ``n_ctx`` >=
            ``len(prompt)`` + the largest pass and ``n_batch`` >= the largest pass.
        prompt: token ids, prefilled once here.
        feature_layers: layer-input indices the ``features`` variant captures.
    Raises:
        ValueError: a recurrent target (its state cannot be cut back after a pass), or an empty prompt.
        ContextOverflowError: the prompt does not fit.
    """

    def __init__(self, target: Target, prompt: list[int], feature_layers: list[int]):
        if not target.can_truncate:
            raise ValueError(f"a {target.model.arch} target cannot drop a verified pass (recurrent state); "
                             "this benchmark needs a target that can truncate (see tfm-bench verify)")
        self.target, self.n_prompt, self.feature_layers = target, len(prompt), list(feature_layers)
        target.set_features([])
        target.prefill(prompt)

    def setup(self, variant: str, n_max: int) -> str | None:
        """Prepare ``variant`` for passes of up to ``n_max`` tokens; a reason string when it cannot run
        here (then it is skipped), else None. Raises ValueError for an unknown variant."""
        t = self.target
        t.detach_choice()
        t.set_features([])
        if variant == "argmax":
            if not t.attach_argmax(n_max):
                return "the backend cannot run the top-1 sampler (Target.attach_argmax refused)"
        elif variant == "sample":
            if not t.attach_sampler(SAMPLE, 0, n_max):
                return "the backend cannot run the token sampler (Target.attach_sampler refused)"
        elif variant == "features":
            try:
                t.set_features(self.feature_layers)
            except ValueError as e:
                return str(e)
        elif variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
        return None

    def teardown(self) -> None:
        """Back to plain logits: the backend argmax detached, feature capture off."""
        self.target.detach_choice()
        self.target.set_features([])

    def _pass(self, variant: str) -> Callable[[list[int]], float | None]:
        """The pass of ``variant``: tokens -> the ``perf_counter`` time its decode call returned
        (``last_row`` only; None for the others)."""
        t = self.target

        def logits(tok):
            t.verify(tok)

        def argmax(tok):
            t.verify(tok, backend_choice=True)

        def argmax_host(tok):
            np.argmax(t.verify(tok).logits, axis=1)

        def features(tok):
            t.verify(tok)
            t.features(slice(0, len(tok)), len(tok))

        def last_row(tok):
            t.ctx.decode_tokens(tok, t.n_past, "last")
            ts = time.perf_counter()
            t.ctx.logits(1)  # llama_get_logits waits for the backend
            return ts
        return {"logits": logits, "argmax": argmax, "sample": argmax, "logits+argmax_host": argmax_host, "features": features,
                "last_row": last_row}[variant]

    def time(self, variant: str, tokens: list[int], n_warmup: int, n_iter: int) -> dict:
        """Time ``n_iter`` passes of ``variant`` over ``tokens`` (after ``n_warmup`` untimed), each removed
        again; ``setup(variant, ...)`` must have succeeded. Returns ``{"median_ms", "min_ms",
        "ms_per_token" (median / n), "remove": {median_ms, min_ms}}`` plus ``"submit"`` for ``last_row``.

        Raises RuntimeError when a pass was not removed (the cache no longer ends at the prompt), and
        llama.cpp's errors (LlamaError, ContextOverflowError) from the decode.
        """
        run, t = self._pass(variant), self.target
        ms: dict[str, list[float]] = {"pass": [], "remove": [], "submit": []}
        for i in range(n_warmup + n_iter):
            t0 = time.perf_counter()
            ts = run(tokens)
            t1 = time.perf_counter()
            # the pass removed (llama_memory_seq_rm from n_prompt): nothing of a verification committed
            t.commit([]) if variant != "last_row" else t.ctx.truncate(t.n_past)
            t2 = time.perf_counter()
            self.check_cache()
            if i >= n_warmup:
                ms["pass"].append((t1 - t0) * 1e3)
                ms["remove"].append((t2 - t1) * 1e3)
                if ts is not None:
                    ms["submit"].append((ts - t0) * 1e3)
        out = time_stats(ms["pass"])
        out["ms_per_token"] = out["median_ms"] / len(tokens)
        out.update({k: time_stats(ms[k]) for k in ("remove", "submit") if ms[k]})
        return out

    def check_cache(self) -> None:
        """Raise RuntimeError unless the cache holds exactly the prompt (positions 0 .. n_prompt - 1)."""
        pos_max = self.target.ctx.pos_max()
        if self.target.n_past != self.n_prompt or pos_max != self.n_prompt - 1:
            raise RuntimeError(f"a pass was not removed: n_past {self.target.n_past}, last cached position "
                               f"{pos_max}, prompt {self.n_prompt} tokens")


def run(bench: PassBench, sizes: list[int], variants: list[str], n_warmup: int, n_iter: int,
        rng: np.random.Generator, log: Callable[[str], None] = lambda s: None) -> tuple[list[dict], dict]:
    """Time every variant at every pass size, sizes in the outer loop (the variants of one size run
    back to back; each case is set up again, its warm-up passes absorb a graph re-reserve). The n
    tokens of a size are a seeded random sample of valid ids, the same for every variant.

    Returns (cases ``{"tokens", "variant", **PassBench.time}`` in that order, ``{variant: reason}`` of
    the variants skipped). ``log`` gets one line per case. Raises ValueError for an unknown variant.
    """
    n_vocab = bench.target.model.n_vocab
    cases, skipped = [], {}
    for n in sizes:
        tokens = [int(x) for x in rng.integers(0, n_vocab, n)]
        for v in variants:
            if v in skipped:
                continue
            why = bench.setup(v, max(sizes))
            if why:
                skipped[v] = why
                log(f"{v}: skipped ({why})")
                continue
            try:
                cases.append({"tokens": n, "variant": v, **bench.time(v, tokens, n_warmup, n_iter)})
            finally:
                bench.teardown()
            log(f"n={n} {v}: median {cases[-1]['median_ms']:.3f} ms")
    return cases, skipped
