"""Held-out sequences of the corpus: never trained on, scored during the fit.

The acceptance proxy on training batches rises as the drafter learns its corpus, whether or not
that carries over to new prompts (docs/training.md, "The shipped drafter and how it got there":
before held-out sequences the training batches' proxy ran 0.8–1.5 above τ). ``split`` sets the last ``n`` usable sequences of the corpus aside (the corpus is in
the seeded order of its shuffled prompts, so these are a random sample that stays the same for a
given corpus); ``eval_batches`` cuts them into fixed batches with fixed anchors; ``evaluate``
gives their weighted loss and acceptance proxy without touching the weights.
"""
from __future__ import annotations

import numpy as np
import torch

from .batching import Batch, make_batch, plan_batches
from .corpus import Sequence
from .errors import TrainError
from .recipe import acceptance_proxy, block_loss

#: seed-sequence word that keeps the held-out anchors apart from every training step's
EVAL_STREAM = 2**31 - 1


def split(seqs: list[Sequence], n: int) -> tuple[list[Sequence], list[Sequence]]:
    """(training, held-out): the last ``n`` sequences held out, and kept out of training with them every
    other sequence of the same prompt (same ``prompt_order`` and ``prompt_index``, e.g. a sampled
    response beside a greedy one): a held-out prompt is never trained on.

    Raises:
        TrainError: ``n`` < 0, or fewer than one training sequence would be left.
    """
    if n < 0:
        raise TrainError(f"held-out sequences must be >= 0, got {n}")
    if n >= len(seqs):
        raise TrainError(f"cannot hold out {n} of {len(seqs)} usable corpus sequences: none would be left to train on")
    if not n:
        return seqs, []
    held = seqs[len(seqs) - n:]
    prompts = {(s.prompt_order, s.prompt_index) for s in held if s.prompt_order}
    train = [s for s in seqs[:len(seqs) - n] if (s.prompt_order, s.prompt_index) not in prompts]
    if not train:
        raise TrainError(f"holding out {n} sequences and the other responses to their prompts leaves none to train on")
    return train, held


def eval_batches(seqs: list[Sequence], n_anchors: int, block: int, mask_id: int, max_len: int,
                 batch_tokens: int, seed: int) -> list[Batch]:
    """The held-out sequences as batches of at most ``batch_tokens`` padded tokens, with anchors drawn
    once from (``seed``, ``EVAL_STREAM``): every evaluation of a run scores the same blocks."""
    rng = np.random.default_rng([seed, EVAL_STREAM])
    plan = plan_batches([min(len(s.ids), max_len) for s in seqs], batch_tokens, seed, EVAL_STREAM)
    return [make_batch([seqs[i] for i in idx], n_anchors, block, mask_id, max_len, rng) for idx in plan]


@torch.no_grad()
def evaluate(drafter, target, batches: list[Batch], weights: torch.Tensor, block: int, device,
             autocast: bool) -> dict[str, float]:
    """Weighted block loss and acceptance proxy over ``batches`` (each batch weighted by its anchors).

    Returns ``{"heldout_loss": float, "heldout_tau": float}`` (the proxy as in ``recipe``: accepted
    drafts, without the target's own token).
    """
    loss_sum = tau_sum = 0.0
    n_sum = 0
    for b in batches:
        b = b.to(device)
        loss, correct = block_loss(drafter, target, b, weights, block, autocast)
        n = int(b.anchor_ok.sum())
        loss_sum += float(loss) * n
        tau_sum += acceptance_proxy(correct, b.anchor_ok) * n
        n_sum += n
    n_sum = max(n_sum, 1)
    return {"heldout_loss": loss_sum / n_sum, "heldout_tau": tau_sum / n_sum}
