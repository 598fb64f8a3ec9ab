"""Tree builders over per-position top-K marginals.

- chain: the drafter's argmax at every depth (the DFlash chain; a degenerate tree).
- DDTree (arXiv 2604.12989, "Diffusion Draft Trees"): best-first by path
  log-probability (sum of the marginal log-probs along the path) with a
  heap, until ``budget`` nodes. Children are pushed lazily (first child of a
  popped node, next sibling of a popped node), which is exact because each
  position's candidates are sorted.
- w-wide (TfM, "Trees from Marginals"): pop the w best frontier entries and
  expand them together, ⌈B/w⌉ sequential steps; ``rescore`` (optional)
  re-scores the children of a whole step at once, the hook for a learned
  re-scorer (Weaver). Without it, scores are the marginals'.

Inputs: ``cand_tokens`` int ``[D, K]`` and ``cand_logp`` float ``[D, K]``, the
top-K candidates of block positions 1..D sorted by descending log-prob.
"""
from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

from .tree import Tree

Rescore = Callable[[Tree, list[tuple[int, int, int]]], np.ndarray]


def build_chain(root: int, cand_tokens: np.ndarray, cand_logp: np.ndarray, budget: int) -> Tree:
    """The top-1 chain of ``min(budget, D)`` drafts."""
    n = min(budget, cand_tokens.shape[0])
    lp = np.cumsum(cand_logp[:n, 0])
    return Tree.from_lists(root, [(i, int(cand_tokens[i, 0]), float(lp[i])) for i in range(n)])


def build_ddtree(root: int, cand_tokens: np.ndarray, cand_logp: np.ndarray, budget: int) -> Tree:
    """Best-first tree of ``budget`` drafted nodes by path log-probability (DDTree)."""
    return build_wide(root, cand_tokens, cand_logp, budget, width=1)


def build_wide(root: int, cand_tokens: np.ndarray, cand_logp: np.ndarray, budget: int, width: int = 4,
               rescore: Rescore | None = None) -> Tree:
    """Pop ``width`` frontier entries per step and expand them together (TfM w-wide heap).

    A frontier entry is (parent node, depth index d, candidate rank k). With
    width 1 and no rescore this is exactly DDTree's best-first order.
    """
    D, K = cand_tokens.shape
    nodes: list[tuple[int, int, float]] = []  # (parent, token, path logp)
    node_logp = [0.0]
    heap: list[tuple[float, int, int, int]] = []  # (-score, parent, d, k)
    if D and K and budget > 0:
        heapq.heappush(heap, (-float(cand_logp[0, 0]), 0, 0, 0))
    while heap and len(nodes) < budget:
        step = [heapq.heappop(heap) for _ in range(min(width, len(heap), budget - len(nodes)))]
        for neg, parent, d, k in step:
            nodes.append((parent, int(cand_tokens[d, k]), -neg))
            node_logp.append(-neg)
        pushes = []
        first = len(nodes) - len(step) + 1  # node index of step[0]
        for i, (neg, parent, d, k) in enumerate(step):
            node = first + i
            if k + 1 < K:  # next sibling under the same parent
                pushes.append((parent, d, k + 1))
            if d + 1 < D:  # first child of the new node
                pushes.append((node, d + 1, 0))
        scores = _scores(pushes, node_logp, cand_logp, rescore, root, nodes)
        for (parent, d, k), s in zip(pushes, scores):
            heapq.heappush(heap, (-float(s), parent, d, k))
    return Tree.from_lists(root, nodes)


def _scores(pushes, node_logp, cand_logp, rescore, root, nodes) -> list[float]:
    if rescore is not None and pushes:
        return list(rescore(Tree.from_lists(root, nodes), pushes))
    return [node_logp[p] + float(cand_logp[d, k]) for p, d, k in pushes]


BUILDERS = {"chain": build_chain, "ddtree": build_ddtree, "wide": build_wide}
