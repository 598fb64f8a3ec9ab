"""The tree stage: draft trees built from the drafter's per-position marginals.

A tree is node 0 = the root (the last committed token) plus drafted nodes in topological order;
node i is verified at position P + depth(i). A chain is the chain-shaped tree.

Builders share one interface: ``build(root, cand_tokens, cand_logp, budget) -> Tree``:

- chain: the drafter's argmax at every depth (the DFlash chain; a degenerate tree).
- DDTree (arXiv 2604.12989, "Diffusion Draft Trees"): best-first by path
  log-probability (sum of the marginal log-probs along the path) with a
  heap, until ``budget`` nodes. Children are pushed lazily (first child of a
  popped node, next sibling of a popped node), which is exact because each
  position's candidates are sorted.
- w-wide (TfM, "Trees from Marginals"): pop the w best frontier entries and
  expand them together, ⌈B/w⌉ sequential steps; ``rescore`` (optional)
  re-scores the children of a whole step at once. Without it, scores are the marginals'.
- TfM (``build_tfm``): the w-wide heap whose scores come from a path scorer (the Weaver,
  ``decode.weaver``): each new node's next-depth candidates scored given its path.
- DARTree (``build_dartree``): depth by depth, W live branches scored in one path-scorer call each
  depth, then one deferred global top-B over the materialised supertree.

Inputs: ``cand_tokens`` int ``[D, K]`` and ``cand_logp`` float ``[D, K]``, the
top-K candidates of block positions 1..D sorted by descending log-prob.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Tree:
    """A draft tree, node 0 the root.

    parents: int32 ``[N]``, ``parents[0] = -1``, ``parents[i] < i``.
    tokens: int32 ``[N]``; ``tokens[0]`` is the root's token (the last committed token).
    depth: int32 ``[N]``, ``depth[0] = 0``; node i is verified at position P + depth[i].
    logp: float64 ``[N]``, the drafter's path log-probability (0 at the root).
    """

    parents: np.ndarray
    tokens: np.ndarray
    depth: np.ndarray
    logp: np.ndarray

    @classmethod
    def from_lists(cls, root_token: int, nodes: list[tuple[int, int, float]]) -> "Tree":
        """Build from ``[(parent, token, path_logp), ...]`` given in topological order."""
        parents = [-1] + [p for p, _, _ in nodes]
        depth = [0]
        for p, _, _ in nodes:
            depth.append(depth[p] + 1)
        return cls(np.asarray(parents, np.int32), np.asarray([root_token] + [t for _, t, _ in nodes], np.int32),
                   np.asarray(depth, np.int32), np.asarray([0.0] + [lp for _, _, lp in nodes], np.float64))

    @classmethod
    def root(cls, token: int) -> "Tree":
        """The tree of the root alone (a plain decoding step)."""
        return cls(np.array([-1], np.int32), np.array([token], np.int32), np.zeros(1, np.int32), np.zeros(1))

    def __len__(self) -> int:
        return int(self.parents.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    def path(self, node: int) -> list[int]:
        """Node indices from the root to ``node``."""
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parents[node])
        return out[::-1]

    def truncate(self, n_drafted: int) -> "Tree":
        """The root and the first ``n_drafted`` drafted nodes (a valid tree: parents precede children).

        For a best-first (DDTree) tree this is the best-first tree of that budget.
        """
        n = min(len(self), n_drafted + 1)
        return Tree(self.parents[:n].copy(), self.tokens[:n].copy(), self.depth[:n].copy(), self.logp[:n].copy())

    def select(self, keep: np.ndarray) -> "Tree":
        """The nodes where ``keep`` (bool ``[N]``) is True, in their order, parents renumbered. ``keep`` must
        hold the root and every kept node's parent (ValueError otherwise)."""
        keep = np.asarray(keep, bool)
        if keep.shape != (len(self),) or not keep[0] or not keep[self.parents[1:][keep[1:]]].all():
            raise ValueError("the kept nodes must include the root and every kept node's parent")
        new = np.cumsum(keep) - 1
        parents = np.where(self.parents[keep] < 0, -1, new[np.maximum(self.parents[keep], 0)]).astype(np.int32)
        return Tree(parents, self.tokens[keep].copy(), self.depth[keep].copy(), self.logp[keep].copy())

Rescore = Callable[[Tree, list[tuple[int, int, int]]], np.ndarray]


def build_chain(root: int, cand_tokens: np.ndarray, cand_logp: np.ndarray, budget: int) -> Tree:
    """The top-1 chain of ``min(budget, D)`` drafts."""
    n = max(min(budget, cand_tokens.shape[0]), 0)
    tokens = np.empty(n + 1, np.int32)
    tokens[0], tokens[1:] = root, cand_tokens[:n, 0]
    logp = np.zeros(n + 1, np.float64)
    logp[1:] = np.cumsum(cand_logp[:n, 0])
    return Tree(np.arange(-1, n, dtype=np.int32), tokens, np.arange(n + 1, dtype=np.int32), logp)


def build_ddtree(root: int, cand_tokens: np.ndarray, cand_logp: np.ndarray, budget: int) -> Tree:
    """Best-first tree of ``budget`` drafted nodes by path log-probability (DDTree).

    The same tree as ``build_wide(..., width=1)`` (one pop per step, same heap entries and order),
    in a loop without the per-step lists of the w-wide builder: it runs on every decode step.
    """
    D, K = cand_tokens.shape
    tokens, logp = cand_tokens.tolist(), cand_logp.tolist()
    parents, toks, depth, path_logp = [-1], [int(root)], [0], [0.0]
    heap: list[tuple[float, int, int, int]] = []  # (-score, parent, d, k), as build_wide's
    if D and K and budget > 0:
        heap.append((-float(logp[0][0]), 0, 0, 0))
    while heap and len(parents) <= budget:
        neg, parent, d, k = heapq.heappop(heap)
        node = len(parents)
        parents.append(parent)
        toks.append(int(tokens[d][k]))
        depth.append(d + 1)
        path_logp.append(-neg)
        if k + 1 < K:  # next sibling under the same parent
            heapq.heappush(heap, (-(path_logp[parent] + logp[d][k + 1]), parent, d, k + 1))
        if d + 1 < D:  # first child of the new node
            heapq.heappush(heap, (-(-neg + logp[d + 1][0]), node, d + 1, 0))
    return Tree(np.array(parents, np.int32), np.array(toks, np.int32), np.array(depth, np.int32),
                np.array(path_logp, np.float64))


def build_wide(root: int, cand_tokens: np.ndarray, cand_logp: np.ndarray, budget: int, width: int = 4,
               rescore: Rescore | None = None) -> Tree:
    """Pop ``width`` frontier entries per step and expand them together (TfM w-wide heap).

    A frontier entry is (parent node, depth index d, candidate rank k). With
    width 1 and no rescore this is exactly DDTree's best-first order.
    """
    D, K = cand_tokens.shape
    tokens, logp = cand_tokens.tolist(), cand_logp.tolist()  # Python scalars: ~3x faster than numpy indexing
    nodes: list[tuple[int, int, float]] = []  # (parent, token, path logp)
    node_logp = [0.0]
    heap: list[tuple[float, int, int, int]] = []  # (-score, parent, d, k)
    if D and K and budget > 0:
        heapq.heappush(heap, (-float(logp[0][0]), 0, 0, 0))
    while heap and len(nodes) < budget:
        step = [heapq.heappop(heap) for _ in range(min(width, len(heap), budget - len(nodes)))]
        for neg, parent, d, k in step:
            nodes.append((parent, int(tokens[d][k]), -neg))
            node_logp.append(-neg)
        pushes = []
        first = len(nodes) - len(step) + 1  # node index of step[0]
        for i, (neg, parent, d, k) in enumerate(step):
            node = first + i
            if k + 1 < K:  # next sibling under the same parent
                pushes.append((parent, d, k + 1))
            if d + 1 < D:  # first child of the new node
                pushes.append((node, d + 1, 0))
        scores = _scores(pushes, node_logp, logp, rescore, root, nodes)
        for (parent, d, k), s in zip(pushes, scores):
            heapq.heappush(heap, (-float(s), parent, d, k))
    return Tree.from_lists(root, nodes)


def _scores(pushes, node_logp, logp, rescore, root, nodes) -> list[float]:
    """Scores of the pushed frontier entries: the rescorer's, else parent path logp + the candidate's
    (``logp`` the marginals as nested lists)."""
    if rescore is not None and pushes:
        return list(rescore(Tree.from_lists(root, nodes), pushes))
    return [node_logp[p] + logp[d][k] for p, d, k in pushes]


#: A TfM round's scorer: the candidate ranks of each path (one rank per depth; ``()`` = the root) →
#: float ``[n_paths, K]``, the log-probabilities of the K candidates of each path's next depth.
PathScorer = Callable[[list[tuple[int, ...]]], np.ndarray]


def build_tfm(root: int, cand_tokens: np.ndarray, budget: int, score: PathScorer, width: int = 4,
              children: int = 8) -> Tree:
    """A TfM tree (Trees from Marginals, arXiv 2607.06763): each round pops the ``width`` best frontier
    entries, makes them nodes, and scores the candidates of the next depth for all of them in one
    ``score`` call (the Weaver, conditioned on each node's path); each new node offers its ``children``
    best candidates, scored by its cumulative log-probability plus theirs. ⌈B/w⌉ rounds for B nodes.

    Args:
        cand_tokens: int ``[D, K]``, the drafter's candidates of block positions 1..D.
        budget: drafted nodes. score: ``PathScorer``.
    Returns:
        the tree; ``logp`` holds the scorer's cumulative log-probabilities (``TfmHeap``, which the
        trainer's reference drives for many drafts at once).
    """
    heap = TfmHeap(root, cand_tokens, budget, width, children)
    while heap.wants:
        heap.feed(score(heap.wants))
    return heap.tree()


class TfmHeap:
    """The w-wide heap of one TfM tree, driven from outside: ``wants`` lists the paths (candidate ranks,
    ``()`` = the root) whose next-depth log-probabilities ``feed`` takes (float ``[len(wants), K]``);
    empty once the tree is complete (``tree``). Several heaps can be fed from one batched scorer call."""

    def __init__(self, root: int, cand_tokens: np.ndarray, budget: int, width: int, children: int):
        self.root, self.cand, self.budget, self.width, self.children = root, cand_tokens, budget, width, children
        D, K = cand_tokens.shape
        self.nodes: list[tuple[int, int, float]] = []
        self._ranks: list[tuple[int, ...]] = [()]
        self._heap: list[tuple[float, int, int, int]] = []  # (-score, parent, parent depth, rank)
        self._waiting = [0] if D and K and budget >= 1 else []

    @property
    def wants(self) -> list[tuple[int, ...]]:
        return [self._ranks[v] for v in self._waiting]

    def feed(self, lps: np.ndarray) -> None:
        """Push the waiting nodes' ``children`` best candidates, then pop rounds of ``width`` entries
        until some new node needs scoring or the tree is complete."""
        for v, lp in zip(self._waiting, lps):
            base = 0.0 if v == 0 else self.nodes[v - 1][2]
            for k in np.argsort(-lp, kind="stable")[:self.children]:
                heapq.heappush(self._heap, (-(base + float(lp[k])), v, len(self._ranks[v]), int(k)))
        self._waiting = []
        D = self.cand.shape[0]
        while self._heap and len(self.nodes) < self.budget and not self._waiting:
            for _ in range(min(self.width, len(self._heap), self.budget - len(self.nodes))):
                neg, parent, d, k = heapq.heappop(self._heap)
                self.nodes.append((parent, int(self.cand[d, k]), -neg))
                self._ranks.append(self._ranks[parent] + (k,))
                if d + 1 < D:
                    self._waiting.append(len(self.nodes))
            if len(self.nodes) >= self.budget:
                self._waiting = []

    def tree(self) -> Tree:
        return Tree.from_lists(self.root, self.nodes)


def build_dartree(root: int, cand_tokens: np.ndarray, budget: int, score: PathScorer, width: int = 12,
                  beta: float = -0.2) -> Tree:
    """A DARTree tree (arXiv 2608.13524): depth by depth, the candidates of every live branch are scored
    in one ``score`` call and all of them materialised (path score = parent's + the candidate's
    log-probability); the ``width`` best become the live branches of the next depth. After the last
    depth one global top-``budget`` over every materialised node by ``path + beta·depth`` picks the tree.

    With ``beta`` ≤ 0 a child never ranks above its parent, so the selection is prefix-closed and is the
    set a best-first heap over the same scored supertree selects (the paper's Lemma 1;
    ``best_first_selection``, ``tests/test_tree_builders.py``). Ties go to the node materialised first.

    Args:
        cand_tokens: int ``[D, K]``. budget: drafted nodes. score: ``PathScorer``. width: W, live branches
            per depth (the paper's 12). beta: depth bonus, ≤ 0 (the paper's code: −0.2).
    Returns:
        the tree in topological order (by depth, then rank); ``logp`` holds the path scores.
    Raises:
        ValueError: beta > 0 (the selection would not be prefix-closed).
    """
    if beta > 0:
        raise ValueError(f"beta must be <= 0 (a positive depth bonus breaks prefix closure), got {beta}")
    return dartree_select(root, cand_tokens, dartree_supertree(cand_tokens, score, width), budget, beta)


def dartree_supertree(cand_tokens: np.ndarray, score: PathScorer, width: int):
    """DARTree's materialised supertree: ``(parents, depth, scores, ranks)`` over its nodes (node 0 =
    the root; int / int / float64 / int ``[n]``, ``ranks[v]`` node v's candidate rank at its depth),
    depth-major: the children of one depth's live branches, branch by branch, rank by rank."""
    grow = DartreeGrowth(cand_tokens, width)
    while grow.wants:
        grow.feed(score(grow.wants))
    return grow.supertree()


class DartreeGrowth:
    """One draft's DARTree supertree grown depth by depth from outside (``dartree_supertree`` drives one;
    the trainer's held-out τ drives many from one batched scorer call a depth): ``wants`` lists the live
    branches (candidate ranks, ``()`` = the root) whose next-depth log-probabilities ``feed`` takes (float
    ``[len(wants), >= K]``, the first K used); empty once every depth is scored (``supertree``)."""

    def __init__(self, cand_tokens: np.ndarray, width: int):
        self.K, self.D, self.width = cand_tokens.shape[1], cand_tokens.shape[0], width
        self._parts = ([np.array([-1])], [np.array([0])], [np.array([0.0])], [np.array([-1])])
        self._live, self._scores = np.array([0]), np.array([0.0])
        self.wants: list[tuple[int, ...]] = [()] if self.D and self.K else []
        self._n, self._d = 1, 0

    def feed(self, lps) -> None:
        K = self.K
        s = (self._scores[:, None] + np.asarray(lps, dtype=np.float64)[:, :K]).reshape(-1)
        ks = np.tile(np.arange(K), len(self._live))
        for part, v in zip(self._parts, (np.repeat(self._live, K), np.full(len(s), self._d + 1), s, ks)):
            part.append(v)
        order = np.argsort(-s, kind="stable")[:self.width]
        self.wants = [self.wants[o // K] + (int(ks[o]),) for o in order]
        self._live, self._scores = self._n + order, s[order]
        self._n += len(s)
        self._d += 1
        if self._d >= self.D:
            self.wants = []

    def supertree(self):
        """``(parents, depth, scores, ranks)`` as ``dartree_supertree`` returns them."""
        return tuple(np.concatenate(p) for p in self._parts)


def dartree_select(root: int, cand_tokens: np.ndarray, supertree, budget: int, beta: float) -> Tree:
    """The tree of the global top-``budget`` of a DARTree supertree by path + beta·depth (``build_dartree``'s
    last step). Raises ValueError when the selection is not prefix-closed (scores that are not log-probabilities)."""
    parents, depth, scores, ranks = supertree
    keep = np.sort(global_top(scores + beta * depth, budget))
    if not np.isin(parents[keep], np.append(keep, 0)).all():
        raise ValueError("the selection is not prefix-closed: the scorer must return log-probabilities (<= 0)")
    return _select(root, cand_tokens, parents, depth, scores, ranks, keep)


def dartree_from_rounds(root: int, cand_tokens: np.ndarray, rows: list[int], live: np.ndarray,
                        live_score: np.ndarray, sel: np.ndarray, sel_score: np.ndarray) -> Tree | None:
    """The DARTree tree from what a builder on the backend reads back (``weaver.Weaver.dartree``), numbered
    as ``build_dartree`` numbers it: the live branches of each round (flat child indices ``r * K + k`` into
    the round before, in any order; ``rows[d]`` of them in round d, round 0 the root alone) and the
    selected nodes (indices into the children of all rounds, round 0's first; any order) with their path
    scores. Work is O(B + the live branches), never over the supertree's nodes.

    Args:
        cand_tokens: int ``[D, K]``. rows: live branches a round (``weaver_native.dartree_rows``).
        live / live_score: ``[sum(rows[1:])]``; sel / sel_score: ``[B]``.
    Returns:
        the tree (``logp`` the path scores), or None when the selection is not prefix-closed (only possible on
        an exact tie between a node and its parent, beta = 0: the caller then builds on the host).
    """
    D, K = cand_tokens.shape
    start = np.concatenate([[0], np.cumsum([K * r for r in rows])])  # each round's first child (backend)
    offset = start + 1                                                 # ... and in build_dartree's numbering
    rank = [np.zeros(1, np.int64)]   # each round's rows: their rank in build_dartree's live order
    ref = [np.zeros(1, np.int64)]    # ... and their node index there (the root's 0)
    at = 0
    for d in range(1, len(rows)):
        o = live[at:at + rows[d]].astype(np.int64)
        at += rows[d]
        idx = offset[d - 1] + rank[d - 1][o // K] * K + o % K
        order = np.lexsort((idx, -live_score[at - rows[d]:at].astype(np.float64)))
        r = np.empty(len(o), np.int64)
        r[order] = np.arange(len(o))
        rank.append(r)
        ref.append(idx)
    sel = sel.astype(np.int64)
    d = np.searchsorted(start, sel, side="right") - 1
    o = sel - start[d]
    node = np.array([offset[a] + rank[a][b // K] * K + b % K for a, b in zip(d, o)], np.int64)
    parent = np.array([0 if a == 0 else ref[a][b // K] for a, b in zip(d, o)], np.int64)
    order = np.argsort(node, kind="stable")
    index = {0: 0}
    index.update({int(v): i + 1 for i, v in enumerate(node[order])})
    nodes = []
    for i in order:
        p = index.get(int(parent[i]))
        if p is None:
            return None
        nodes.append((p, int(cand_tokens[d[i], o[i] % K]), float(sel_score[i])))
    return Tree.from_lists(root, nodes)


def global_top(prune: np.ndarray, budget: int) -> np.ndarray:
    """Indices of the ``budget`` best drafted nodes (node 0 excluded) by ``prune``, ties to the lower index."""
    cand = np.arange(1, len(prune))
    order = np.lexsort((cand, -prune[1:]))
    return cand[order[:budget]]


def best_first_selection(parents: np.ndarray, prune: np.ndarray, budget: int) -> np.ndarray:
    """The nodes a best-first heap over the supertree ``parents`` selects: pop the best frontier node by
    ``prune`` (ties to the lower index), push its children, ``budget`` times. The reference of Lemma 1."""
    children: dict[int, list[int]] = {}
    for v in range(1, len(parents)):
        children.setdefault(int(parents[v]), []).append(v)
    heap = [(-float(prune[c]), c) for c in children.get(0, [])]
    heapq.heapify(heap)
    out = []
    while heap and len(out) < budget:
        _, v = heapq.heappop(heap)
        out.append(v)
        for c in children.get(v, []):
            heapq.heappush(heap, (-float(prune[c]), c))
    return np.asarray(sorted(out), dtype=np.int64)


def _select(root, cand_tokens, parents, depth, scores, ranks, keep) -> Tree:
    """The tree of the supertree's nodes ``keep`` (sorted; prefix-closed), renumbered in that order."""
    index = {0: 0}
    nodes = []
    for v in keep:
        v = int(v)
        index[v] = len(nodes) + 1
        nodes.append((index[int(parents[v])], int(cand_tokens[depth[v] - 1, ranks[v]]), float(scores[v])))
    return Tree.from_lists(root, nodes)


BUILDERS = {"chain": build_chain, "ddtree": build_ddtree, "wide": build_wide}
