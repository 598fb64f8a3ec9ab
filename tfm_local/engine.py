"""The generate loop: prefill, then draft → verify → accept → commit until done.

One decode step (shared/DESIGN.md §1): the drafter proposes a chain of k
tokens after the last emitted token; the target verifies ``[last, d_1..d_k]``
in one pass; the acceptance walk (accept.py) emits the accepted drafts and
one token of the target's own; both KV caches are brought to the committed
prefix and the accepted tokens' features are injected into the drafter.
With no drafter or ``budget=0`` the same loop is plain decoding.
"""
from __future__ import annotations

import os
import time
from typing import Iterator

import numpy as np

from .accept import walk_tree
from .drafter import DFlashDrafter
from .sampling import SamplingParams, TokenChooser
from .stats import GenerationStats
from .stops import StopMatcher
from .target import Target
from .tokenizer import StreamDecoder, render_chat


class Engine:
    """Speculative decoding engine over a GGUF target and an optional DFlash drafter.

    Args:
        target: model spec of the target (path, ``owner/repo:file.gguf`` or a built-in name).
        drafter: drafter spec, ``"auto"`` (the default drafter for the target) or None (plain decoding).
        n_ctx: context length in tokens.
        budget: draft tokens verified per step (default block size - 1; 0 = plain decoding).
        kv_type / drafter_kv_type: KV cache types ("f16", "q8_0").
        n_threads: CPU threads (default: all cores). n_gpu_layers: -1 = all on the GPU when there is one.
    Raises:
        ModelNotFoundError / FileNotFoundError: a model cannot be found.
        DrafterMismatchError: the drafter does not fit the target.
    """

    def __init__(self, target: str | os.PathLike | None = None, drafter: str | os.PathLike | None = "auto", *,
                 n_ctx: int = 4096, budget: int | None = None, kv_type: str = "f16",
                 drafter_kv_type: str = "f16", n_threads: int | None = None, n_gpu_layers: int = -1):
        from .drafters import resolve_drafter
        from .models import DEFAULT_TARGET, resolve_model

        target_path = resolve_model(target or DEFAULT_TARGET)
        self.target = Target(target_path, n_ctx=n_ctx, kv_type=kv_type, n_threads=n_threads,
                             n_gpu_layers=n_gpu_layers)
        self.drafter: DFlashDrafter | None = None
        if drafter is not None and budget != 0:
            dpath = resolve_drafter(drafter, target_path)
            self.drafter = DFlashDrafter(dpath, self.target, kv_type=drafter_kv_type, n_threads=n_threads,
                                         n_gpu_layers=n_gpu_layers)
        self.budget = 0
        self.set_budget(budget)
        self.tok = self.target.tok
        self.stats = GenerationStats()

    # -- public API ----------------------------------------------------------------------
    def set_budget(self, budget: int | None) -> None:
        """Draft tokens verified per step: None = block size - 1, 0 = plain decoding (drafter idle).

        Raises ValueError for a negative budget.
        """
        max_budget = self.drafter.block_size - 1 if self.drafter else 0
        b = max_budget if budget is None else min(int(budget), max_budget)
        if b < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        if self.drafter is not None and (b > 0) != (self.budget > 0):
            self.target.set_features(self.drafter.layers if b > 0 else [])
        self.budget = b

    @property
    def active_drafter(self) -> DFlashDrafter | None:
        """The drafter when speculation is on (budget > 0), else None."""
        return self.drafter if self.budget > 0 else None

    def prompt_tokens(self, prompt: str | list[dict]) -> list[int]:
        """Token ids of a raw prompt string, or of chat ``messages`` rendered with the target's template."""
        if isinstance(prompt, str):
            return self.tok.encode(prompt, add_special=True)
        text = render_chat(self.target.model, self.tok, list(prompt))
        bos = self.tok.piece(self.tok.bos).decode("utf-8", "replace") if self.tok.bos >= 0 else None
        return self.tok.encode(text, add_special=not (bos and text.startswith(bos)))

    def generate(self, prompt: str | list[dict], max_tokens: int = 256, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, seed: int | None = None,
                 stop: list[str] | str | None = None, stream: bool = False) -> Iterator[str] | str:
        """Generate text after ``prompt`` (a string or OpenAI-style chat messages).

        Returns the text, or with ``stream=True`` an iterator of text pieces.
        ``self.stats`` holds the statistics of the last generation.
        Raises ContextOverflowError (before any work) when the prompt does not fit.
        """
        sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
        ids = self.prompt_tokens(prompt)
        self.target.check_fits(len(ids))
        stops = [stop] if isinstance(stop, str) else stop
        it = self._text_stream(ids, max_tokens, sp, stops)
        return it if stream else "".join(it)

    def generate_ids(self, prompt_ids: list[int], max_tokens: int, sp: SamplingParams) -> Iterator[int]:
        """Token ids generated after ``prompt_ids`` (stops after an end-of-generation token)."""
        for t in self._token_stream(prompt_ids, max_tokens, sp):
            yield t
            if self.tok.is_eog(t):
                return

    # -- internals -----------------------------------------------------------------------
    def _text_stream(self, ids, max_tokens, sp, stops) -> Iterator[str]:
        dec, matcher = StreamDecoder(self.tok), StopMatcher(stops)
        for t in self.generate_ids(ids, max_tokens, sp):
            if self.tok.is_eog(t):
                self.stats.finish_reason = "stop"
                break
            text, hit = matcher.feed(dec.feed(t))
            if text:
                yield text
            if hit:
                self.stats.finish_reason = "stop"
                return
        tail = matcher.feed(dec.flush())[0] + matcher.flush()
        if tail:
            yield tail

    def _token_stream(self, prompt_ids: list[int], max_tokens: int, sp: SamplingParams) -> Iterator[int]:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        st = self.stats = GenerationStats(n_prompt=len(prompt_ids), finish_reason="length")
        t0 = time.perf_counter()
        choose = TokenChooser(sp)
        tgt, dft = self.target, self.active_drafter
        if dft is not None:
            dft.reset()
        on_chunk = (lambda s, n: dft.inject(tgt.features(slice(0, n), n), s)) if dft else None
        last = choose(tgt.prefill(prompt_ids, on_chunk))
        st.t_prefill = time.perf_counter() - t0
        st.n_generated = 1
        st.t_total = time.perf_counter() - t0
        yield last
        while st.n_generated < max_tokens and tgt.n_past + 1 <= tgt.n_ctx:
            for t in self._step(last, max_tokens - st.n_generated, choose, st):
                st.n_generated += 1
                st.t_total = time.perf_counter() - t0
                yield t
                last = t

    def _step(self, last: int, remaining: int, choose: TokenChooser, st: GenerationStats) -> list[int]:
        """One draft → verify → accept → commit step; returns the tokens it emits."""
        tgt, dft = self.target, self.active_drafter
        pos = tgt.n_past
        k = min(self.budget, remaining - 1, tgt.n_ctx - pos - 1)
        t0 = time.perf_counter()
        drafts = dft.draft_chain(last, pos, k) if dft is not None and k > 0 else []
        t1 = time.perf_counter()
        tokens = [last] + drafts
        logits = tgt.verify(tokens)
        parents = np.arange(-1, len(tokens) - 1)
        walk = walk_tree(parents, np.asarray(tokens), lambda node: choose(logits[node]), max_tokens=remaining)
        tgt.commit(len(walk.path))
        t2 = time.perf_counter()
        if dft is not None:
            dft.inject(tgt.features(np.asarray(walk.path), len(tokens)), pos)
        st.t_draft += t1 - t0 + time.perf_counter() - t2
        st.t_verify += t2 - t1
        st.n_steps += 1
        st.n_step_tokens += len(walk.tokens)
        st.n_drafted += len(drafts)
        return walk.tokens

    def close(self) -> None:
        """Free both models and contexts."""
        if self.drafter is not None:
            self.drafter.close()
        self.target.close()
