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

* the CPU backend, a chain of at most ``SMALL_BATCH_ROWS`` nodes on a target whose weights are all of
  ``SMALL_BATCH_TYPES``: exact (``batch_invariant``; tie gap 0). Patch 0015's small-batch products give
  every row of such a pass the bits of a 1-token pass (tests/test_batch_invariance.py), and a chain is
  committed by cutting the cache back, so its cells stay in position order as plain decoding's do:
  greedy speculative output equals plain decoding token for token, and any divergence is a bug;
* the CPU backend otherwise (trees, whose commit leaves the kept cells out of position order; passes
  over 16 rows, which take the GEMMs; other weight types): passes of 4 or more rows moved the gap
  between two tokens by up to 0.79 before the small-batch products (0.92 counting the drift of caches
  built by other batch sizes): ``CPU_TIE_GAP`` = 1.0 for every size;
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


#: The most rows of a batch-invariant CPU pass (ggml-cpu/smallbatch.h, GGML_CPU_SMALLBATCH_MAX_COLS).
SMALL_BATCH_ROWS = 16
#: GGML types whose small-batch products have the 1-row product's bits on x86 (patch 0015): F32, Q4_0,
#: Q8_0, Q4_K, Q6_K (a weight of any other type, F16 included, takes a GEMM that sums otherwise).
SMALL_BATCH_TYPES = frozenset({0, 2, 8, 12, 14})


def weight_types(path) -> frozenset[int]:
    """The GGML types of a GGUF file's tensors (``files.gguf_meta``); empty when it does not parse."""
    from .files.gguf_meta import GGUFError, read_gguf_meta

    try:
        return frozenset(t.ggml_type for t in read_gguf_meta(path).tensors)
    except (GGUFError, OSError):
        return frozenset()


def small_batch_exact(model) -> bool:
    """Whether every pass of at most ``SMALL_BATCH_ROWS`` rows of ``model`` (``llama.model.Model``) gives
    each row the bits of a 1-token pass: the CPU backend and every weight of its file of
    ``SMALL_BATCH_TYPES`` (the module doc). Such a model's cache, prefilled in passes of that many rows
    (``Target.prefill_rows``), holds the same bits however its tokens were split into passes."""
    if model is None or getattr(model, "on_gpu", False):
        return False
    types = weight_types(model.path)
    return bool(types) and types <= SMALL_BATCH_TYPES


def batch_invariant(target, n_nodes: int | None, chain: bool) -> bool:
    """Whether greedy speculative decoding on ``target`` (``Target``) equals plain decoding token for token
    by construction: verification chains (``chain``) of at most ``SMALL_BATCH_ROWS`` nodes (``n_nodes``;
    None = any size: False) on a target whose small passes are exact (``small_batch_exact``)."""
    if not chain or n_nodes is None or n_nodes > SMALL_BATCH_ROWS:
        return False
    return small_batch_exact(getattr(target, "model", None))


def tie_gap(target, n_nodes: int | None = None, chain: bool = False) -> float:
    """The near-tie gap (logits) for ``target``'s backend (``Target``; its model's ``on_gpu``) and
    verification passes of up to ``n_nodes`` nodes (None: any size, the widest gap), chains
    (``chain``) or trees: 0 where the passes are batch-invariant (``batch_invariant``: no divergence
    is a near-tie)."""
    if batch_invariant(target, n_nodes, chain):
        return 0.0
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
             sp=None, chain: bool = False) -> Divergence | None:
    """Check a divergence of ``out`` from the plain greedy output ``ref`` (None when equal).

    ``target`` is a :class:`tfm_local.decode.verify.Target`; its KV cache is reset by a prefill of
    ``prompt_ids + ref[:i]`` (float32 logits ``[n_vocab]`` of the next token). Outputs that differ
    only in length (one stopped earlier) are not a near-tie. ``gap`` None: ``tie_gap(target, n_nodes,
    chain)`` (``n_nodes``: the most nodes a verification of ``out`` had, None = any; ``chain``: every
    verification was a chain). With
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
        gap = tie_gap(target, n_nodes, chain)
    return Divergence(i, int(ref[i]), int(out[i]), gaps, max(gaps) < gap)
