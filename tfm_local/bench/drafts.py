"""The cost of the DFlash drafter's passes, one kind at a time (``tfm-bench pass --drafter``).

After the target has prefilled a prompt of ``n_prompt`` tokens whose features were injected into the
drafter, each timed pass works at the drafter position ``n_prompt`` and leaves the drafter's cache as
it found it for the next one (``DFlashDrafter.inject`` and the block passes truncate to their start
position first). The variants (``DRAFT_VARIANTS``):

- ``inject1`` / ``inject16``: ``DFlashDrafter.inject`` of 1 / 16 feature rows (random float32 rows of
  the real width: the KV writes of one plain step's token / of an accepted run);
- ``topk``: ``DFlashDrafter.top_k`` of a full block (15 drafts, k = 8 as the engine's DDTree): the
  block pass with the backend top-k sampler, ids and log-probs to the host;
- ``logits``: ``DFlashDrafter.marginals`` of the same block: all 15 rows' logits to the host;
- ``step``: ``inject1`` then ``topk`` one position later, as in an engine step (two decode calls);
- ``step@d`` (``depth_variant``): the same step drafting ``d`` block positions (a block of ``d + 1`` rows: the
  last token and ``d`` masks), the drafter's cost of a depth-``d`` draft.

Times are wall-clock ms from ``time.perf_counter``, every pass ending with its results on the host.
"""
from __future__ import annotations

import time

import numpy as np

from ..decode.draft import DFlashDrafter
from .gdn import time_stats

DRAFT_VARIANTS = ("inject1", "inject16", "topk", "logits", "step")


def depth_variant(depth: int) -> str:
    """The variant name of a depth-``depth`` drafter step (``step@d``)."""
    return f"step@{depth}"


def parse_depth(variant: str) -> int | None:
    """``d`` of a ``step@d`` variant; None for any other name. Raises ValueError for a malformed depth."""
    if not variant.startswith("step@"):
        return None
    d = variant[len("step@"):]
    if not d.isdigit() or int(d) < 1:
        raise ValueError(f"drafter variant {variant!r}: the depth must be a positive integer")
    return int(d)
#: block drafts and candidates per row of the topk / logits / step variants; feature rows of inject16
N_DRAFT, TOP_K, N_ROWS = 15, 8, 16
#: the method in one paragraph, for a result file
DRAFT_METHOD = ("drafter passes at position ctx after a prompt of ctx tokens whose features were injected: "
                "inject1 / inject16 = DFlashDrafter.inject of 1 / 16 random feature rows; topk = top_k of a "
                "15-draft block with k = 8 (backend sampler); logits = marginals of the same block (all rows' "
                "logits); step = inject1 then topk; each pass truncates the drafter cache to its start first; "
                "wall-clock ms, median and min over the timed passes")


class DraftBench:
    """Times ``drafter``'s passes after its target's prompt (prefilled, features injected by the caller).

    Args:
        drafter: a loaded drafter whose cache holds the prompt's features up to ``drafter.n_injected``.
        width: feature row width (``len(drafter.layers) * target n_embd``).
        rng: draws the random feature rows and the block's last token.
    Raises:
        ValueError: no prompt injected yet, or too little context left for a block after it.
    """

    def __init__(self, drafter: DFlashDrafter, width: int, rng: np.random.Generator):
        self.drafter, self.pos = drafter, drafter.n_injected
        if self.pos < 1:
            raise ValueError("inject the prompt's features first")
        if self.pos + N_ROWS + drafter.block_size > drafter.ctx.n_ctx:
            raise ValueError(f"the drafter context ({drafter.ctx.n_ctx}) has no room after {self.pos} tokens")
        self.rows = rng.standard_normal((N_ROWS, width)).astype(np.float32)
        self.last = int(rng.integers(0, drafter.model.n_vocab))

    def _pass(self, variant: str):
        d, p, last = self.drafter, self.pos, self.last
        return {"inject1": lambda: d.inject(self.rows[:1], p),
                "inject16": lambda: d.inject(self.rows, p),
                "topk": lambda: d.top_k(last, p, N_DRAFT, TOP_K),
                "logits": lambda: d.marginals(last, p, N_DRAFT),
                "step": lambda: (d.inject(self.rows[:1], p), d.top_k(last, p + 1, N_DRAFT, TOP_K))}[variant]

    def _depth_pass(self, depth: int):
        d, p, last = self.drafter, self.pos, self.last
        if not 0 < depth < d.block_size:
            raise ValueError(f"drafter step depth {depth} is outside 1..{d.block_size - 1} (block {d.block_size})")
        return lambda: (d.inject(self.rows[:1], p), d.top_k(last, p + 1, depth, TOP_K))

    def time(self, variant: str, n_warmup: int, n_iter: int) -> dict:
        """Median and min ms (``time_stats``) of ``n_iter`` passes of ``variant`` after ``n_warmup``
        untimed ones (they absorb a graph re-reserve when the sampler is attached or detached).

        Raises ValueError for an unknown variant or a depth outside 1..block_size-1; llama.cpp's errors
        from the decodes.
        """
        depth = parse_depth(variant)
        if depth is None and variant not in DRAFT_VARIANTS:
            raise ValueError(f"unknown drafter variant {variant!r}; choose from {', '.join(DRAFT_VARIANTS)} "
                             "or step@DEPTH")
        run, ms = (self._pass(variant) if depth is None else self._depth_pass(depth)), []
        for i in range(n_warmup + n_iter):
            t0 = time.perf_counter()
            run()
            if i >= n_warmup:
                ms.append((time.perf_counter() - t0) * 1e3)
        self.drafter.ctx.truncate(self.pos)
        self.drafter.n_injected = self.pos
        return time_stats(ms)


def run_drafter(bench: DraftBench, variants: list[str], n_warmup: int, n_iter: int) -> list[dict]:
    """``[{"variant", "median_ms", "min_ms"}, ...]`` for ``variants`` in order (``DraftBench.time``)."""
    return [{"variant": v, **bench.time(v, n_warmup, n_iter)} for v in variants]
