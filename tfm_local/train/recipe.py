"""The DFlash training recipe: weighted block loss, acceptance proxy, AdamW with warmup + cosine.

Method: DFlash (arXiv 2602.06036; z-lab/dflash). Per step, the frozen
PyTorch target gives the layer-input features of whole sequences; the drafter
predicts every block position of every anchor in one forward (attention mask
``model.block_mask``); the cross-entropy of block position k (1 ≤ k < S) is
weighted ``w_k = exp(-(k-1)/γ)`` (early positions matter most: a draft is
accepted left to right). Embedding and LM head are the target's, frozen.
bf16 autocast on CUDA, float32 on the CPU.

With ``soft_weight`` α > 0 each position's loss is (1 − α)·CE(label) + α·CE(p_target),
the cross-entropy against the target's whole next-token distribution (from the
PyTorch target's final hidden state at the previous position and its LM head):
knowledge distillation on top of the greedy label, as in the EAGLE/Medusa
drafter recipes.

A DFlash2 drafter (``config.dflash2``) adds its path selector's loss, trained jointly: at every
labelled block position, the candidates are the drafter's top-K tokens (K = ``selector_top_k``), the
predecessor the target's own token before the label (teacher forcing; the anchor at position 1), and
the loss the cross-entropy of the label among the candidates' selector scores (the drafter's logits
held fixed plus the bilinear term, ``CandidateSelector.scores``); a position whose label is not a
candidate adds none (``selector_loss``).

The acceptance proxy is the expected accepted length of a greedy chain if
the drafter's top-1 were checked against the labels (the target's greedy
tokens): mean over anchors of Σ_k Π_{j≤k} 1[top1_j = label_j].
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .batching import IGNORE, Batch
from .model import DFlashDraft, block_mask


@dataclass
class FitOptions:
    """Options of ``fit`` (defaults: a full run on one GPU).

    Attributes:
        epochs: passes over the corpus (each with fresh anchors).
        lr, min_lr: peak and final learning rate (cosine decay after a linear
            warmup over ``warmup`` × total steps).
        weight_decay, grad_clip: AdamW decay; global gradient-norm clip.
        batch_tokens: padded tokens per batch (sequences × longest).
        anchors: blocks per sequence per step. gamma: loss decay γ.
        max_len: sequences are cut to this many tokens.
        seed: batching and anchor seed. save_every: checkpoint period (steps).
        max_steps: stop after this many steps in total (None = all epochs).
        log_every: steps between log lines.
        time_budget_s: wall-clock seconds for the whole fit of a session
            (None = no limit): the step time is measured as the fit runs and
            the schedule (warmup, cosine) is re-fitted to end within it
            (``timebudget.TimeBudget``).
        holdout: corpus sequences never trained on (the last ones, ``heldout``);
            their loss and acceptance proxy are logged every ``eval_every``
            steps and at the end (0 = none).
        soft_weight: α of the distillation term (0 = labels only; the held-out
            loss is always the label cross-entropy, comparable across runs).
        reference_weight: α for the sequences of reference corpora (ShareGPT's own replies, not the
            target's: 1 = their tokens are context only, the label is the target's distribution).
        emphasis: an emphasis file (``emphasis.py``: prompts whose training sequences are repeated)
            or None. emphasis_times: how many times per epoch those sequences are trained on (1 = none).
    """

    epochs: int = 6
    lr: float = 6e-4
    min_lr: float = 0.0
    warmup: float = 0.04
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    batch_tokens: int = 32768
    anchors: int = 16
    gamma: float = 7.0
    max_len: int = 3072
    seed: int = 0
    save_every: int = 500
    max_steps: int | None = None
    log_every: int = 10
    time_budget_s: float | None = None
    holdout: int = 0
    eval_every: int = 100
    soft_weight: float = 0.0
    reference_weight: float = 1.0
    emphasis: str | None = None
    emphasis_times: int = 1


def position_weights(block: int, gamma: float, device=None) -> torch.Tensor:
    """``[block]`` float32: 0 at position 0 (the anchor), ``exp(-(k-1)/γ)`` at k ≥ 1."""
    k = torch.arange(block, dtype=torch.float32, device=device)
    return torch.where(k == 0, torch.zeros_like(k), torch.exp(-(k - 1) / gamma))


def lr_factor(step: int, total: int, warmup: float, min_ratio: float) -> float:
    """Multiplier of the peak learning rate at ``step``: linear warmup then cosine to ``min_ratio``."""
    n_warm = max(1, int(round(warmup * total)))
    if step < n_warm:
        return (step + 1) / n_warm
    t = min(1.0, (step - n_warm) / max(1, total - n_warm))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def acceptance_proxy(correct: torch.Tensor, anchor_ok: torch.Tensor) -> float:
    """Mean over valid anchors of Σ_k Π_{j≤k} correct_j.

    Args:
        correct: bool ``[B, A, S-1]`` top-1 agreement at block positions 1..S-1
            (False where there is no label).
        anchor_ok: bool ``[B, A]``.
    """
    run = torch.cumprod(correct.float(), dim=-1).sum(-1)
    n = anchor_ok.sum()
    return float((run * anchor_ok).sum() / n) if n > 0 else 0.0


def block_loss(drafter: DFlashDraft, target, batch: Batch, weights: torch.Tensor, block: int,
               autocast: bool, soft_weight: float = 0.0, reference_weight: float = 1.0
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted cross-entropy of one batch and the top-1 agreement per block position.

    Args:
        drafter: the model being trained. target: a ``TorchTarget`` (features,
            embedding, LM head; frozen; every block loaded when ``soft_weight`` > 0).
        batch: on the target's device.
        weights: ``[block]`` from ``position_weights``. autocast: bf16 autocast (CUDA).
        soft_weight: α in [0, 1] of the cross-entropy against the target's distribution.
        reference_weight: α of the sequences with ``batch.reference`` set (ShareGPT's replies).
    Returns:
        (scalar loss, bool correct ``[B, A, block-1]``).
    """
    B, L = batch.ids.shape
    A = batch.anchors.shape[1]
    alpha = torch.where(batch.reference, reference_weight, soft_weight).float()  # [B], per sequence
    if bool((alpha > 0).any()):
        feats, final = target.layer_inputs_and_final(batch.ids, drafter.feature_layers)
    else:
        feats, final = target.layer_inputs(batch.ids, drafter.feature_layers), None
    feats = feats.float()
    noise = target.embed(batch.noise).float()  # residual stream in float32; matmuls autocast
    mask = block_mask(batch.anchors, L, block)
    with torch.autocast(device_type=batch.ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        h = drafter(feats, torch.arange(L, device=batch.ids.device), noise, batch.noise_pos, mask)
        sel = batch.labels != IGNORE
        hs = h[sel]
    labels = batch.labels[sel]
    w = weights.repeat(A)[None, :].expand(B, -1)[sel]
    soft = None
    if final is not None:  # the label at position p is predicted by the target's state at p - 1
        rows = torch.arange(B, device=h.device)[:, None].expand(-1, A * block)[sel]
        soft = (final[rows, batch.noise_pos[sel] - 1], alpha[rows])
    total, hits = _chunked_head_loss(target.lm_head, hs, labels, w, autocast, soft=soft)
    loss = total / w.sum().clamp(min=1e-9)
    if drafter.config.dflash2:
        rows = torch.arange(B, device=h.device)[:, None].expand(-1, A * block)[sel]
        prev = batch.ids[rows, batch.noise_pos[sel] - 1]  # the target's token before each label
        loss = loss + selector_loss(drafter, target.lm_head, hs, prev, labels, w, autocast)[0]
    correct = torch.zeros(B, A * block, dtype=torch.bool, device=h.device)
    correct[sel] = hits
    return loss, correct.view(B, A, block)[:, :, 1:]


HEAD_CHUNK = 8192  # rows of the LM head computed at once: bounds the [rows, n_vocab] logits in memory


def head_topk(lm_head, h: torch.Tensor, k: int, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top-``k`` token ids, their logits, the log-normaliser ``[..., 1]``) of ``lm_head(h)``, ``h`` split
    along its first dimension in pieces of ``chunk`` (the full logits are never kept)."""
    parts = []
    for c in h.split(chunk):
        logits = lm_head(c).float()
        vals, ids = logits.topk(k, -1)
        parts.append((ids, vals, torch.logsumexp(logits, -1, keepdim=True)))
    if not parts:
        z = h.new_zeros(*h.shape[:-1], k)
        return z.long(), z, z[..., :1]
    ids, vals, lse = (torch.cat(t) for t in zip(*parts))
    return ids, vals, lse


def selector_loss(drafter: DFlashDraft, lm_head, h: torch.Tensor, prev: torch.Tensor, labels: torch.Tensor,
                  w: torch.Tensor, autocast: bool, chunk: int = HEAD_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlash2's selector loss over labelled block positions (see the module doc).

    Args:
        h: ``[rows, hidden]`` the drafter's final hidden states. prev, labels: int ``[rows]``, the
            target's token before each label and the label. w: ``[rows]`` position weights.
    Returns:
        (Σ w·CE / Σ w over the rows whose label is a candidate (0 when none), bool ``[rows]``: the
        selector's best candidate after ``prev`` is the label).
    """
    K = drafter.config.selector_top_k
    cand, unary = [], []
    with torch.no_grad():  # the candidates and their logits, chunk by chunk (never [rows, n_vocab] at once)
        for s in range(0, h.shape[0], chunk):
            with torch.autocast(device_type=h.device.type, dtype=torch.bfloat16, enabled=autocast):
                top = lm_head(h[s:s + chunk]).float().topk(K, dim=-1)
            cand.append(top.indices)
            unary.append(top.values)
    cand, unary = torch.cat(cand), torch.cat(unary)
    scores = drafter.candidate_selector.scores(h.float(), unary, prev[:, None], cand)[:, 0]  # [rows, K]
    is_label = cand == labels[:, None]
    has = is_label.any(-1)
    hits = has & (scores.argmax(-1) == is_label.float().argmax(-1))
    if not bool(has.any()):
        return scores.sum() * 0.0, hits
    ce = F.cross_entropy(scores[has], is_label[has].float().argmax(-1), reduction="none")
    return (ce * w[has]).sum() / w[has].sum().clamp(min=1e-9), hits


def _head_ce(lm_head, h: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, autocast: bool,
             h_target: torch.Tensor | None = None, alpha: torch.Tensor | None = None):
    with torch.autocast(device_type=h.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = lm_head(h).float()
    logp = torch.log_softmax(logits, dim=-1)  # one log-softmax over the vocabulary serves both terms
    ce = F.nll_loss(logp, labels, reduction="none")
    if h_target is not None:
        with torch.no_grad(), torch.autocast(device_type=h.device.type, dtype=torch.bfloat16, enabled=autocast):
            p_target = torch.softmax(lm_head(h_target).float(), dim=-1)
        ce = (1 - alpha) * ce + alpha * -(p_target * logp).sum(-1)
    return (ce * w).sum(), logits.argmax(-1) == labels


def _chunked_head_loss(lm_head, h: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, autocast: bool,
                       chunk: int = HEAD_CHUNK, soft: tuple[torch.Tensor, torch.Tensor] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ w·CE(lm_head(h), labels) and top-1 hits, ``chunk`` rows at a time.

    ``soft = (h_target, α)`` mixes in α·CE against softmax(lm_head(h_target)) row by row
    (``h_target``: the target's final hidden states, one row per row of ``h``; no gradient; α float32
    ``[rows]``, one weight per row).
    Each chunk runs under activation checkpointing, so the ``[rows, n_vocab]``
    logits are never kept for the backward pass (they are recomputed): memory
    is O(chunk · n_vocab) whatever the number of block positions.
    """
    from torch.utils.checkpoint import checkpoint

    total = h.new_zeros((), dtype=torch.float32)
    hits = []
    for i in range(0, h.shape[0], chunk):
        args = (h[i:i + chunk], labels[i:i + chunk], w[i:i + chunk], autocast)
        if soft is not None:
            args += (soft[0][i:i + chunk], soft[1][i:i + chunk])
        if torch.is_grad_enabled() and h.requires_grad:
            s, hit = checkpoint(_head_ce, lm_head, *args, use_reentrant=False)
        else:
            s, hit = _head_ce(lm_head, *args)
        total = total + s
        hits.append(hit)
    return total, torch.cat(hits) if hits else labels.new_zeros(0, dtype=torch.bool)
