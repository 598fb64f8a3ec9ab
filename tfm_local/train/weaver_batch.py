"""The Weaver's inputs, computed from batches of corpus sequences by the frozen PyTorch target and drafter:
shared by its training (``weaver_fit``) and its held-out measure of trees (``weaver_eval``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .batching import IGNORE, Batch
from .heldout import eval_batches
from .model import DFlashDraft, block_mask
from .recipe import head_topk
from .weaver import Weaver


@dataclass
class WeaverInputs:
    """One batch's Weaver inputs (N drafts of D positions, K candidates; on the target's device).

    Attributes:
        h_target ``[N, H_t]``, h_drafter ``[N, D, H_d]``, step_emb ``[N, D, H_t]`` float32;
        cand int64 ``[N, D, K]``, cand_logit and cand_logp float32 ``[N, D, K]`` (the drafter's top-K,
        best first: logits, and log-probabilities over the whole vocabulary); head ``[n_vocab, H_t]``
        the target's LM head (``head_rows``: the candidates' rows); labels int64 ``[N, D]`` (``IGNORE``
        past a sequence's end); root int64 ``[N]`` the anchor's token (step 0).
    """

    h_target: torch.Tensor
    h_drafter: torch.Tensor
    step_emb: torch.Tensor
    cand: torch.Tensor
    cand_logit: torch.Tensor
    head: torch.Tensor
    labels: torch.Tensor
    cand_logp: torch.Tensor
    root: torch.Tensor

    @property
    def head_rows(self) -> torch.Tensor:
        """``[N, D, K, H_t]`` float32: the candidates' LM-head rows."""
        return self.head[self.cand].float()

    def codes(self, weaver: Weaver) -> torch.Tensor:
        """The candidates' codes ``[N, D, K, r]`` (with gradients into P): through the whole head's table
        when there are more candidates than vocabulary rows (less memory and work), else row by row."""
        if self.cand.numel() > self.head.shape[0]:
            return weaver.codes(self.head.float())[self.cand]
        return weaver.codes(self.head_rows)


@torch.no_grad()
def weaver_inputs(target, drafter: DFlashDraft, batch: Batch, top_k: int) -> WeaverInputs:
    """The Weaver's inputs of every valid anchor of ``batch`` (module doc): the target's final hidden
    state before the anchor's token, the drafter's block pass, its top-``top_k`` candidates per
    position and the teacher-forced path (the anchor token, then the target's tokens)."""
    B, L = batch.ids.shape
    S = drafter.config.block_size
    A = batch.anchors.shape[1]
    feats, final = target.layer_inputs_and_final(batch.ids, drafter.feature_layers)
    noise = target.embed(batch.noise).float()
    h = drafter(feats.float(), torch.arange(L, device=batch.ids.device), noise, batch.noise_pos,
                block_mask(batch.anchors, L, S)).view(B, A, S, -1)
    bi, ai = batch.anchor_ok.nonzero(as_tuple=True)
    anchors = batch.anchors[bi, ai]
    h_drafter = h[bi, ai, 1:].float()                                    # [N, D, H_d]
    # 64 drafts at a time: the top-k ids and logits and the log-normaliser (full logits never kept)
    cand, cand_logit, lse = head_topk(target.lm_head, h_drafter, min(top_k, target.head.shape[0]), 64)
    cand_logp = cand_logit - lse
    labels = batch.labels.view(B, A, S)[bi, ai, 1:]
    root = batch.noise.view(B, A, S)[bi, ai, 0]
    path = torch.where(labels[:, :-1] == IGNORE, torch.zeros_like(labels[:, :-1]), labels[:, :-1])
    steps = torch.cat([root[:, None], path], 1)
    return WeaverInputs(final[bi, anchors - 1].float(), h_drafter, target.embed(steps).float(), cand, cand_logit,
                        target.head, labels, cand_logp, root)


def heldout_batches(seqs, opts, drafter: DFlashDraft, device):
    """The held-out sequences' batches with anchors drawn once (``heldout.eval_batches``, seed 0), on ``device``;
    ``opts`` a ``weaver_fit.WeaverOptions`` (its anchors, max_len and batch_tokens)."""
    dc = drafter.config
    for b in eval_batches(seqs, opts.anchors, dc.block_size, dc.mask_token_id, opts.max_len, opts.batch_tokens, 0):
        yield b.to(device)
