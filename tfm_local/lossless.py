"""Telling a numerical near-tie from a bug when speculative output differs from plain decoding.

At temperature 0 speculative decoding must emit the target's own greedy tokens. Batched
verification computes the same logits as one-token decoding up to float rounding (other
reduction orders, other kernels on CUDA; Q4 targets move by up to ~0.2, docs/design.md §3),
so where the target's best logits nearly tie, the two runs may pick different tokens and then
continue differently. A divergence is a near-tie when, at its first differing position, the
logits of both tokens (from a prefill of the common prefix) lie within the tie gap of the best;
anything else is a bug. The gap is per backend and batch size, from measurement
(``lab/gpu/divergence.py``: an n-node pass against its nodes' paths decoded one token at a time, and
the census of DDTree@64/@128 outputs against plain greedy decoding):

* the 2-core AVX-512 CPU with llama.cpp's weight repacking: passes of 1-3 rows equal 1-token
  decoding bit for bit, passes of 4 or more rows move the gap between two tokens by up to 0.79 (0.92
  counting the drift of caches built by other batch sizes): ``CPU_TIE_GAP`` = 1.0 for every size;
* CUDA on the H200, the default Q4_K_M target (43 paths per size, 59 prompts of census):
  passes of 2-8 nodes move a gap between near competitors by at most 0.29 (``TIE_GAP`` = 0.5), passes
  of 16 by 0.82, of 64 and 128 by 1.44 (``WIDE_TIE_GAP`` = 1.5 from ``WIDE_NODES`` = 16 nodes on); an
  argmax flipped by a 128-node pass had a 1-token gap of 0.61. The 63 divergences of the census all
  sat at 1-token gaps below 0.22, and the DDTree@64 divergence at a gap of 0.72 seen before lies
  within the measured spread of 64-node passes: numerical, not a bug.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

TIE_GAP = 0.5       # logits (natural-log units); a target on a GPU, passes under WIDE_NODES nodes
WIDE_TIE_GAP = 1.5  # a target on a GPU, passes of WIDE_NODES nodes or more
WIDE_NODES = 16
CPU_TIE_GAP = 1.0   # a target on the CPU backend, every pass size


def tie_gap(target, n_nodes: int | None = None) -> float:
    """The near-tie gap (logits) for ``target``'s backend (``Target``; its model's ``on_gpu``) and
    verification passes of up to ``n_nodes`` nodes (None: any size, the widest gap)."""
    if not getattr(getattr(target, "model", None), "on_gpu", False):
        return CPU_TIE_GAP
    return TIE_GAP if n_nodes is not None and n_nodes < WIDE_NODES else WIDE_TIE_GAP


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
             gap: float | None = None, rel: float | None = None, n_nodes: int | None = None,
             sp=None) -> Divergence | None:
    """Check a divergence of ``out`` from the plain greedy output ``ref`` (None when equal).

    ``target`` is a :class:`tfm_local.decode.verify.Target`; its KV cache is reset by a prefill of
    ``prompt_ids + ref[:i]`` (float32 logits ``[n_vocab]`` of the next token). Outputs that differ
    only in length (one stopped earlier) are not a near-tie. ``gap`` None: ``tie_gap(target, n_nodes)``
    (``n_nodes``: the most nodes a verification of ``out`` had; None = any). With
    ``rel`` the tie gap is ``rel`` times the largest |logit| there instead (a tolerance relative to the
    logits' scale). ``sp``: the generation's ``SamplingParams`` when it has penalties: they apply to the
    row first (``decode.penalties``), with ``ref[:i]`` as the tokens generated before it.
    """
    i = first_divergence(ref, out)
    if i is None:
        return None
    if i >= min(len(ref), len(out)):
        return Divergence(i, ref[i] if i < len(ref) else None, out[i] if i < len(out) else None, None, False)
    logits = target.prefill(list(prompt_ids) + list(ref[:i]))
    if sp is not None and sp.penalised:
        from .decode.penalties import Penalties

        pen = Penalties(sp, prompt_ids)
        for t in ref[:i]:
            pen.push(t)
        logits = pen.apply(logits)
    logits = np.asarray(logits, dtype=np.float64)
    best = logits.max()
    gaps = (float(best - logits[ref[i]]), float(best - logits[out[i]]))
    if rel is not None:
        gap = rel * float(np.abs(logits).max())
    elif gap is None:
        gap = tie_gap(target, n_nodes)
    return Divergence(i, int(ref[i]), int(out[i]), gaps, max(gaps) < gap)
