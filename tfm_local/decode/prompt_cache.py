"""The prompt cache: what a generation may keep of the caches the last one left.

After a generation the target's KV cache holds its committed tokens (the prompt and every emitted
token but the last) and the drafter's cache the features of a leading run of them. A new prompt that
starts with the same tokens need not be prefilled from position 0: ``PromptCache.plan`` finds the
longest common token prefix and how much of it each cache can give; the engine cuts both caches back
to it (``Target.prefill``'s ``keep``, ``DFlashDrafter.keep``) and prefills only the rest, as llama.cpp's
server and Ollama do with their slot's cache. The reused cells are the ones a cold prefill of the same
tokens would have written: bit for bit on the CPU, where the target prefills and verifies chains in
exact small passes (``Target.prefill_rows``, ``lossless.small_batch_exact``); elsewhere (a GPU, trees)
up to float rounding, as the tokens the last generation emitted were decoded in verification passes
of other sizes than a prefill's chunks (``tfm_local.lossless``).

Rules (each also a reason to keep less, down to a cold prefill):

* the last prompt token is always decoded again (its logits give the first new token): at most
  ``len(prompt) - 1`` tokens are kept;
* a target with a recurrent state (``Target.recurrent``: Gated DeltaNet hybrids, Mamba, LFM2) cannot
  cut that state back: its cache is kept only when the cached tokens are all a strict prefix of the
  new prompt (a follow-up chat turn whose history was decoded by the last generation: the live state
  is then exactly the prefix's), else the prompt is prefilled cold;
* a sliding-window (SWA) cache must still hold the window before the cut (``Context.resumable_at``:
  always so with the full-size window caches the project's contexts keep, llama.cpp's ``swa_full``);
* the drafter keeps the features of the kept tokens up to its first hole (``rows_in_place``: an
  automatic budget's plain stretch captured none). When this generation captures the prompt's features,
  the target keeps no more than the drafter can (the drafter's rows after the cut must be the features
  of every prompt token, as a cold prefill injects them); when it does not, the drafter keeps what it
  holds of the kept prefix;
* anything that wrote to either cache outside the engine's generations (``Context.writes`` changed),
  a generation that failed midway, or another engine setting that empties the caches (warm-up) voids
  the record: the next prompt is prefilled cold.

Sampling needs nothing kept: a draw is keyed by (seed, position) (``sampling.TokenChooser``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token id sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


@dataclass(frozen=True)
class Reuse:
    """What a generation keeps: ``target`` leading prompt tokens of the target's cache (0 = a cold
    prefill), the drafter's rows of ``drafter`` <= ``target`` leading positions (0 = none)."""

    target: int = 0
    drafter: int = 0


@dataclass(frozen=True)
class _Record:
    ids: tuple[int, ...]        # the token ids in the target's cache, positions 0 .. len - 1
    target_writes: int          # Context.writes of the target's and the drafter's context then
    drafter_writes: int | None


class PromptCache:
    """The record of what the caches hold after the engine's last generation, and the plan for the next.

    Args:
        enabled: False = every prompt is prefilled cold (``plan`` keeps nothing).
    """

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self._record: _Record | None = None

    def forget(self) -> None:
        """The caches' contents are unknown from now on (the next plan keeps nothing)."""
        self._record = None

    def remember(self, target, drafter, ids) -> None:
        """After a generation: the target's cache holds exactly ``ids`` (its ``n_past`` committed tokens) and
        the drafter's cache (None: no drafter) the features of a leading run of them."""
        if len(ids) != target.n_past:
            raise ValueError(f"the target holds {target.n_past} tokens, {len(ids)} ids given")
        self._record = _Record(tuple(int(t) for t in ids), target.ctx.writes,
                               drafter.ctx.writes if drafter is not None else None)

    @property
    def cached_ids(self) -> tuple[int, ...]:
        """The token ids the record says the target's cache holds (() when there is no record)."""
        return self._record.ids if self._record is not None else ()

    def plan(self, target, drafter, prompt_ids, capture: bool) -> Reuse:
        """What the generation of ``prompt_ids`` keeps (module doc), and forget the record (the generation
        changes the caches; the engine remembers them again at its end).

        ``drafter``: the engine's drafter (None: none), active or not: its rows are kept consistent
        with the target's cache either way. ``capture``: this generation's prefill injects the prompt's
        features into the drafter (then ``target`` <= the drafter's rows).
        """
        rec, self._record = self._record, None
        if not self.enabled or rec is None or target.ctx.writes != rec.target_writes \
                or target.n_past != len(rec.ids):
            return Reuse()
        if drafter is not None and drafter.ctx.writes != rec.drafter_writes:
            return Reuse()
        n = min(common_prefix(rec.ids, prompt_ids), len(prompt_ids) - 1)
        if target.recurrent and n != len(rec.ids):
            return Reuse()  # the recurrent state is the whole cached sequence's; it cannot be cut back
        d = 0
        if drafter is not None:
            d = min(n, drafter.rows_in_place)
            if not drafter.can_keep(d):
                d = 0
            if capture and d < n:
                if target.recurrent:
                    return Reuse()
                n = d
        if n <= 0 or not (target.recurrent or target.ctx.resumable_at(n)):  # (recurrent: the exact prefix)
            return Reuse()
        return Reuse(n, min(d, n))
