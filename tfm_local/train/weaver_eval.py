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
"""
from __future__ import annotations

import heapq

import numpy as np
import torch

from ..decode.tree import build_ddtree
from .batching import IGNORE
from .weaver import Weaver
from .weaver_fit import WeaverInputs


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
    ``weaver`` (module doc); all N drafts advance together, one batched Weaver call per round.

    Args:
        target: the ``TorchTarget`` (its embeddings of the path tokens). x: the drafts' inputs.
        width: w, frontier entries popped per round. children: candidates a new node offers.
    """
    N, D, K = x.cand.shape
    codes = x.codes(weaver)
    cand = x.cand.cpu().numpy()
    labels = x.labels.cpu().numpy()
    root = x.root.cpu().numpy()
    # per draft: nodes as (parent, depth, k, path of candidate ranks); node 0 the root
    nodes = [[(-1, 0, -1, ())] for _ in range(N)]
    heaps: list[list] = [[] for _ in range(N)]
    todo = [(n, 0) for n in range(N)]  # (draft, node) whose children are to be scored
    while todo:
        scores = _path_scores(weaver, target, x, codes, cand, root, [(n, nodes[n][v][3]) for n, v in todo])
        for (n, v), lp in zip(todo, scores):
            parent_score = 0.0 if v == 0 else -_score_of(nodes[n][v])
            d = nodes[n][v][1]
            for k in np.argsort(-lp, kind="stable")[:children]:
                heapq.heappush(heaps[n], (-(parent_score + float(lp[k])), v, d, int(k)))
        todo = []
        for n in range(N):
            for _ in range(min(width, len(heaps[n]), budget - (len(nodes[n]) - 1))):
                neg, parent, d, k = heapq.heappop(heaps[n])
                nodes[n].append((parent, d + 1, k, nodes[n][parent][3] + (k,), neg))
                if d + 1 < D:
                    todo.append((n, len(nodes[n]) - 1))
    out = np.zeros(N, dtype=np.int64)
    for n in range(N):
        parents = np.array([nd[0] for nd in nodes[n]])
        tokens = np.array([-1] + [int(cand[n, nd[1] - 1, nd[2]]) for nd in nodes[n][1:]])
        out[n] = accepted_length(parents, tokens, labels[n])
    return out


def _score_of(node) -> float:
    return node[4]


def _path_scores(weaver, target, x, codes, cand, root, jobs) -> list[np.ndarray]:
    """Log-softmax over the K candidates of the next depth for each (draft, path of candidate ranks),
    in one Weaver call (paths padded at the end: a step never sees later steps)."""
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
    lp = torch.log_softmax(logits[torch.arange(len(jobs), device=logits.device), last].float(), -1)
    return list(lp.cpu().numpy())


@torch.no_grad()
def compare_trees(weaver: Weaver, target, drafter, seqs, opts, budgets=(16, 32, 64), width: int | None = None,
                  children: int = 8) -> dict:
    """τ (1 + mean accepted tokens) of the chain, DDTree@B and TfM@B over ``seqs`` (anchors of seed 0,
    as ``weaver_fit.evaluate_weaver``): ``{"drafts", "chain", "chain_weaver", "ddtree@B", "tfm@B"}``;
    ``width`` None = ⌈B/16⌉ per budget (the paper's)."""
    from .batching import make_batch, plan_batches
    from .weaver import accepted_prefix, candidate_loss
    from .weaver_fit import weaver_inputs

    dc = drafter.config
    dev = next(weaver.parameters()).device
    lens = [min(len(s.ids), opts.max_len) for s in seqs]
    acc: dict[str, list] = {}
    for i, idx in enumerate(plan_batches(lens, opts.batch_tokens, 0, 0)):
        batch = make_batch([seqs[j] for j in idx], opts.anchors, dc.block_size, dc.mask_token_id, opts.max_len,
                           np.random.default_rng([0, i])).to(dev)
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
    out = {k: 1.0 + float(np.concatenate(v).mean()) if v else 0.0 for k, v in acc.items()}
    out["drafts"] = int(sum(len(a) for a in acc.get("chain", [])))
    return out
