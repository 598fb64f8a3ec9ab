"""Tokens a verified draft would have accepted, chain against DDTree against TfM trees, on corpus
sequences the Weaver was not trained on (the trainer's measure of the Weaver, in PyTorch: the engine's
runtime Weaver is a separate piece).

Teacher-forced and greedy: the target's tokens after each anchor are the corpus's (the target's own
greedy or sampled response), and a draft's accepted length is the depth of the deepest tree node whose
path spells them (``accepted_length``); τ = 1 + its mean (the bonus token). Trees of one budget B:

- chain: the drafter's top-1 at every position (B = D).
- DDTree@B: ``tfm_local.decode.tree.build_ddtree`` on the drafter's top-K log-probabilities.
- TfM@B: the w-wide heap of Trees from Marginals (arXiv 2607.06763; docs/design.md §5): each batched
  Weaver call pops the w best frontier entries, makes them nodes, and scores the candidates of the next
  depth conditioned on each new node's path; each offers its ``children`` best, scored by the parent's
  cumulative log-probability plus the log-softmax over the candidates.
- DARTree@B (arXiv 2608.13524): depth by depth, the W best branches' K candidates scored by the Weaver in
  one batched call a depth for every draft, then one global top-B by path + beta·depth
  (``tfm_local.decode.tree.DartreeGrowth``, ``dartree_select``); swept over W and K at the largest budget.
"""
from __future__ import annotations

import numpy as np
import torch

from ..decode.tree import DartreeGrowth, TfmHeap, build_ddtree, dartree_select
from .batching import IGNORE
from .weaver import Weaver
from .weaver_batch import WeaverInputs, heldout_batches, weaver_inputs


def accepted_length(parents: np.ndarray, tokens: np.ndarray, labels: np.ndarray) -> int:
    """Depth of the deepest node whose path from the root spells ``labels`` (int ``[D]``, ``IGNORE``
    ends it): what the greedy acceptance walk accepts. parents / tokens int ``[n]`` (node 0 the root)."""
    cur, n = 0, 0
    for lab in labels:
        if lab == IGNORE:
            break
        nxt = np.flatnonzero((parents == cur) & (tokens == lab))
        if not len(nxt):
            break
        cur, n = int(nxt[0]), n + 1
    return n


def ddtree_accepted(x: WeaverInputs, budget: int) -> np.ndarray:
    """Accepted tokens per draft (int ``[N]``) of DDTree@``budget`` on the drafter's candidates."""
    cand, logp, labels = x.cand.cpu().numpy(), x.cand_logp.cpu().numpy().astype(np.float64), x.labels.cpu().numpy()
    out = np.zeros(len(cand), dtype=np.int64)
    for i in range(len(cand)):
        t = build_ddtree(0, cand[i], logp[i], budget)
        out[i] = accepted_length(t.parents, t.tokens, labels[i])
    return out


@torch.no_grad()
def tfm_accepted(weaver: Weaver, target, x: WeaverInputs, budget: int, width: int, children: int = 8) -> np.ndarray:
    """Accepted tokens per draft (int ``[N]``) of a TfM tree of ``budget`` drafted nodes built with
    ``weaver`` (module doc): one ``tree.TfmHeap`` per draft, all N advancing together, one batched
    Weaver call per round.

    Args:
        target: the ``TorchTarget`` (its embeddings of the path tokens). x: the drafts' inputs.
        width: w, frontier entries popped per round. children: candidates a new node offers.
    """
    codes = x.codes(weaver)
    cand, labels, root = x.cand.cpu().numpy(), x.labels.cpu().numpy(), x.root.cpu().numpy()
    heaps = [TfmHeap(int(root[n]), cand[n], budget, width, children) for n in range(len(cand))]
    while True:
        jobs = [(n, p) for n, h in enumerate(heaps) for p in h.wants]
        if not jobs:
            break
        scores = iter(_path_scores(weaver, target, x, codes, cand, root, jobs))
        for h in heaps:
            if h.wants:
                h.feed([next(scores) for _ in h.wants])
    out = np.zeros(len(heaps), dtype=np.int64)
    for n, h in enumerate(heaps):
        t = h.tree()
        out[n] = accepted_length(t.parents, t.tokens, labels[n])
    return out


@torch.no_grad()
def dartree_accepted(weaver: Weaver, target, x: WeaverInputs, budget: int, width: int = 12, top_k: int | None = None,
                     beta: float = -0.2) -> np.ndarray:
    """Accepted tokens per draft (int ``[N]``) of DARTree@``budget`` with ``weaver`` as its head (module doc):
    one ``tree.DartreeGrowth`` per draft, all N a depth at a time, one batched Weaver call a depth.

    Args:
        width: W, live branches a depth. top_k: the first K candidates a position (None = all; the Weaver's
            log-softmax then runs over these K). beta: the depth bonus (<= 0).
    """
    codes = x.codes(weaver)
    cand, labels, root = x.cand.cpu().numpy(), x.labels.cpu().numpy(), x.root.cpu().numpy()
    k = top_k or cand.shape[2]
    grow = [DartreeGrowth(cand[n, :, :k], width) for n in range(len(cand))]
    while True:
        jobs = [(n, p) for n, g in enumerate(grow) for p in g.wants]
        if not jobs:
            break
        scores = iter(_path_scores(weaver, target, x, codes, cand, root, jobs, k))
        for g in grow:
            if g.wants:
                g.feed([next(scores) for _ in g.wants])
    out = np.zeros(len(grow), dtype=np.int64)
    for n, g in enumerate(grow):
        t = dartree_select(int(root[n]), cand[n, :, :k], g.supertree(), budget, beta)
        out[n] = accepted_length(t.parents, t.tokens, labels[n])
    return out


def _path_scores(weaver, target, x, codes, cand, root, jobs, top_k: int | None = None) -> list[np.ndarray]:
    """Log-softmax over the K candidates of the next depth (the first ``top_k``, None = all) for each (draft,
    path of candidate ranks), in one Weaver call (paths padded at the end: a step never sees later steps)."""
    S = max(len(p) for _, p in jobs) + 1
    idx = torch.tensor([n for n, _ in jobs], device=x.cand.device)
    ids = np.zeros((len(jobs), S), dtype=np.int64)
    for j, (n, p) in enumerate(jobs):
        ids[j, 0] = root[n]
        for d, k in enumerate(p):
            ids[j, d + 1] = cand[n, d, k]
    steps = target.embed(torch.from_numpy(ids).to(x.cand.device)).float()
    logits = weaver(x.h_target[idx], x.h_drafter[idx], steps, x.cand_logit[idx, :S], codes[idx, :S])
    last = torch.tensor([len(p) for _, p in jobs], device=logits.device)
    lp = torch.log_softmax(logits[torch.arange(len(jobs), device=logits.device), last, :top_k].float(), -1)
    return list(lp.cpu().numpy())


#: DARTree's sweep at the largest budget of ``compare_trees`` (W = 12 and all K are ``dartree@B`` itself)
DARTREE_WIDTHS = (4, 8, 16, 24)
DARTREE_KS = (8, 16, 32)


@torch.no_grad()
def compare_trees(weaver: Weaver, target, drafter, seqs, opts, budgets=(16, 32, 64), width: int | None = None,
                  children: int = 8) -> dict:
    """τ (1 + mean accepted tokens) of the chain, DDTree@B, TfM@B and DARTree@B over ``seqs`` (the batches
    of ``weaver_fit.evaluate_weaver``): ``{"drafts", "chain", "chain_weaver", "ddtree@B", "tfm@B",
    "dartree@B", ...}``; ``width`` None = ⌈B/16⌉ per budget (the paper's). At the largest budget DARTree is
    swept: W in ``DARTREE_WIDTHS`` ("dartree@B/wW") and K in ``DARTREE_KS`` below the Weaver's ("dartree@B/kK")."""
    from .weaver import accepted_prefix, candidate_loss

    acc: dict[str, list] = {}
    for batch in heldout_batches(seqs, opts, drafter, next(weaver.parameters()).device):
        x = weaver_inputs(target, drafter, batch, weaver.config.top_k)
        _, _, base = candidate_loss(x.cand_logit, x.cand, x.labels, IGNORE)
        scores = weaver(x.h_target, x.h_drafter, x.step_emb, x.cand_logit, x.codes(weaver))
        _, _, top1 = candidate_loss(scores, x.cand, x.labels, IGNORE)
        acc.setdefault("chain", []).append(accepted_prefix(base).cpu().numpy())
        acc.setdefault("chain_weaver", []).append(accepted_prefix(top1).cpu().numpy())
        for b in budgets:
            acc.setdefault(f"ddtree@{b}", []).append(ddtree_accepted(x, b))
            w = width or -(-b // 16)
            acc.setdefault(f"tfm@{b}", []).append(tfm_accepted(weaver, target, x, b, w, children))
            acc.setdefault(f"dartree@{b}", []).append(dartree_accepted(weaver, target, x, b))
        b = max(budgets, default=0)
        for w in (DARTREE_WIDTHS if b else ()):
            acc.setdefault(f"dartree@{b}/w{w}", []).append(dartree_accepted(weaver, target, x, b, width=w))
        for k in (k for k in DARTREE_KS if b and k < weaver.config.top_k):
            acc.setdefault(f"dartree@{b}/k{k}", []).append(dartree_accepted(weaver, target, x, b, top_k=k))
    out = {k: 1.0 + float(np.concatenate(v).mean()) if v else 0.0 for k, v in acc.items()}
    out["drafts"] = int(sum(len(a) for a in acc.get("chain", [])))
    return out
