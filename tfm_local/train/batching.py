"""Batches for DFlash training: length-grouped sequences, random anchors, block inputs and labels.

Recipe (DFlash, arXiv 2602.06036; z-lab/dflash): in a target-generated
response, pick random anchor positions ``a``; the drafter sees the target
features of tokens ``0 .. a-1`` (context) and the block
``[x_a, MASK × (B-1)]`` at positions ``a .. a+B-1``, and predicts
``x_{a+1} .. x_{a+B-1}`` at block positions 1 .. B-1, all in parallel.
Anchors lie in the response: ``prompt_len ≤ a ≤ len-2`` (at inference the
first block is drafted after the target's first generated token).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .corpus import Sequence

IGNORE = -100


@dataclass
class Batch:
    """Tensors of one training step (B sequences, A anchors each, block size S).

    Attributes:
        ids: int64 ``[B, L]`` right-padded token ids (context and labels source).
        anchors: int64 ``[B, A]`` anchor positions (0 where invalid).
        anchor_ok: bool ``[B, A]``.
        noise: int64 ``[B, A·S]`` block tokens (anchor token then MASK).
        noise_pos: int64 ``[B, A·S]`` their positions.
        labels: int64 ``[B, A·S]`` target ids, ``IGNORE`` at block position 0,
            past the sequence end, and for invalid anchors.
        reference: bool ``[B]``, True for a sequence whose response is a reference reply
            (``Sequence.reference``: its loss may weigh the target's distribution instead of the label).
    """

    ids: torch.Tensor
    anchors: torch.Tensor
    anchor_ok: torch.Tensor
    noise: torch.Tensor
    noise_pos: torch.Tensor
    labels: torch.Tensor
    reference: torch.Tensor

    def to(self, device) -> "Batch":
        """The same batch with every tensor on ``device``."""
        return Batch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def usable(seqs: list[Sequence], max_len: int) -> list[int]:
    """Indices of sequences with at least one anchor inside ``max_len`` tokens."""
    return [i for i, s in enumerate(seqs) if min(len(s.ids), max_len) - 2 >= s.prompt_len]


def plan_batches(lengths: list[int], batch_tokens: int, seed: int, epoch: int, window: int = 2048) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches of at most ``batch_tokens`` padded tokens.

    Deterministic for (seed, epoch): shuffle, sort by length inside windows
    of ``window`` items (little padding), cut greedily, shuffle the batches.
    A single sequence longer than the budget forms a batch of its own.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    batches: list[list[int]] = []
    for w in range(0, len(order), window):
        chunk = sorted(order[w:w + window].tolist(), key=lambda i: lengths[i])
        cur: list[int] = []
        for i in chunk:
            longest = max([lengths[j] for j in cur] + [lengths[i]])
            if cur and longest * (len(cur) + 1) > batch_tokens:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    return [batches[i] for i in rng.permutation(len(batches))]


def sample_anchors(prompt_len: int, length: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Up to ``n`` distinct sorted anchors in ``[prompt_len, length-2]`` (int64; may be empty)."""
    lo, hi = prompt_len, length - 2
    if hi < lo:
        return np.zeros(0, dtype=np.int64)
    k = min(n, hi - lo + 1)
    return np.sort(rng.choice(np.arange(lo, hi + 1), size=k, replace=False)).astype(np.int64)


def make_batch(seqs: list[Sequence], n_anchors: int, block: int, mask_id: int, max_len: int,
               rng: np.random.Generator) -> Batch:
    """Pad ``seqs`` (truncated to ``max_len``), draw anchors, build blocks and labels."""
    B = len(seqs)
    lens = [min(len(s.ids), max_len) for s in seqs]
    L = max(lens)
    ids = np.zeros((B, L), dtype=np.int64)
    anchors = np.zeros((B, n_anchors), dtype=np.int64)
    ok = np.zeros((B, n_anchors), dtype=bool)
    for b, s in enumerate(seqs):
        ids[b, :lens[b]] = s.ids[:lens[b]]
        a = sample_anchors(s.prompt_len, lens[b], n_anchors, rng)
        anchors[b, :len(a)], ok[b, :len(a)] = a, True
    offs = np.arange(block)
    pos = anchors[:, :, None] + offs  # [B, A, S]
    noise = np.where(offs == 0, np.take_along_axis(ids, anchors, 1)[:, :, None], mask_id)
    inside = (pos < np.array(lens)[:, None, None]) & (offs > 0) & ok[:, :, None]
    labels = np.where(inside, np.take_along_axis(ids, np.minimum(pos, L - 1).reshape(B, -1), 1).reshape(pos.shape),
                      IGNORE)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    ref = np.array([s.reference for s in seqs], dtype=bool)
    return Batch(t(ids), t(anchors), t(ok), t(noise.reshape(B, -1)), t(pos.reshape(B, -1)), t(labels.reshape(B, -1)),
                 t(ref))
