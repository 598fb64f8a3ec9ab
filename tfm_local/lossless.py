"""Telling a numerical near-tie from a bug when speculative output differs from plain decoding.

At temperature 0 speculative decoding must emit the target's own greedy tokens. Batched
verification computes the same logits as one-token decoding up to float rounding (other
reduction orders, other kernels on CUDA; Q4 targets move by up to ~0.2, docs/design.md §3),
so where the target's best logits nearly tie, the two runs may pick different tokens and then
continue differently. A divergence is a near-tie when, at its first differing position, the
logits of both tokens (from a prefill of the common prefix) lie within the tie gap of the best;
anything else is a bug. The gap is per backend, from measurement (``lab/gpu/divergence.py``: an
n-node pass against its nodes' paths decoded one token at a time): on the 2-core AVX-512 CPU with
llama.cpp's weight repacking, passes of 1-3 rows equal 1-token decoding bit for bit and passes of 4
or more rows move the gap between two tokens by up to 0.79 (0.92 counting the drift of caches built
by other batch sizes), so ``CPU_TIE_GAP`` = 1.0; on CUDA ``TIE_GAP`` = 0.5 (Q4 target: logits move by
0.1-0.2 between batch sizes; one DDTree@64 divergence at a gap of 0.72 awaits the same measurement).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

TIE_GAP = 0.5      # logits (natural-log units); a target on a GPU
CPU_TIE_GAP = 1.0  # a target on the CPU backend


def tie_gap(target) -> float:
    """The near-tie gap for ``target``'s backend (``Target``; its model's ``on_gpu``)."""
    return TIE_GAP if getattr(getattr(target, "model", None), "on_gpu", False) else CPU_TIE_GAP


@dataclass
class Divergence:
    """First position where two greedy outputs differ, and whether it is a near-tie.

    ``index``: position in the outputs; ``ref_token``/``out_token``: the two tokens (None where an
    output ended); ``gaps``: best logit minus each token's logit (None when only lengths differ).
    """
    index: int
    ref_token: int | None
    out_token: int | None
    gaps: tuple[float, float] | None
    near_tie: bool


def first_divergence(ref: Sequence[int], out: Sequence[int]) -> int | None:
    """Index of the first differing token, ``min(len)`` when one output is a prefix of the other,
    None when they are equal."""
    if list(ref) == list(out):
        return None
    n = min(len(ref), len(out))
    return next((k for k in range(n) if ref[k] != out[k]), n)


def classify(target, prompt_ids: list[int], ref: Sequence[int], out: Sequence[int],
             gap: float | None = None, rel: float | None = None) -> Divergence | None:
    """Check a divergence of ``out`` from the plain greedy output ``ref`` (None when equal).

    ``target`` is a :class:`tfm_local.decode.verify.Target`; its KV cache is reset by a prefill of
    ``prompt_ids + ref[:i]`` (float32 logits ``[n_vocab]`` of the next token). Outputs that differ
    only in length (one stopped earlier) are not a near-tie. ``gap`` None: ``tie_gap(target)``. With
    ``rel`` the tie gap is ``rel`` times the largest |logit| there instead (a tolerance relative to the
    logits' scale).
    """
    i = first_divergence(ref, out)
    if i is None:
        return None
    if i >= min(len(ref), len(out)):
        return Divergence(i, ref[i] if i < len(ref) else None, out[i] if i < len(out) else None, None, False)
    logits = np.asarray(target.prefill(list(prompt_ids) + list(ref[:i])), dtype=np.float64)
    best = logits.max()
    gaps = (float(best - logits[ref[i]]), float(best - logits[out[i]]))
    if rel is not None:
        gap = rel * float(np.abs(logits).max())
    elif gap is None:
        gap = tie_gap(target)
    return Divergence(i, int(ref[i]), int(out[i]), gaps, max(gaps) < gap)
