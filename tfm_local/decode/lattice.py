"""DFlash2's path-selector lattice: the greedy and sampled walks, and draft trees over it.

Method: DFlash2 (z-lab; docs/design.md §5 and §7). One drafter pass gives, for block positions
1..D, the drafter's top-K candidates and a K × K score of every candidate given each candidate of
the position before (position 1: given the anchor, the last committed token):
score(p → s) = the drafter's logit of s + a low-rank bilinear compatibility of p and s under a gate
from the position's hidden state. The selector's distribution of position j given candidate p of
position j - 1 is softmax over the K candidates of ``score[j, p, :]``; a path's log-probability is
the sum along it (a first-order Markov chain over the candidates).

- ``greedy_walk``: from the anchor, the best successor of the chosen predecessor at each position
  (what upstream llama.cpp's DFlash2 chain drafts).
- ``sample_walk``: at T > 0, each position's candidate drawn from softmax(score / T) given the one
  drawn before. Any proposal is lossless under the target-sampling acceptance walk (``decode.accept``),
  which accepts a drafted token when the target's own draw is that token, i.e. with the target's
  probability of it: a proposal is best at the selector's mode, so the engine drafts greedy walks and
  lattice trees at every temperature, and the sampled walk is for callers that want diverse drafts.
- ``build_lattice_tree``: the exact best-first tree of B nodes by path log-probability: a child's
  log-probability depends on its parent's candidate only, so the heap pushes, per popped node, its
  best child and its parent's next-best child (each node's children sorted once), as DDTree does over
  marginals (``decode.tree.build_ddtree``, which this equals when every predecessor row is the same).
- ``selector_scorer``: the selector as a ``decode.tree.PathScorer``, DARTree's correction head.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from .tree import PathScorer, Tree


@dataclass
class Lattice:
    """One DFlash2 drafter pass's lattice over block positions 1..D.

    cand: int64 ``[D, K]``, the drafter's top-K candidates of each position by logit, in no particular
        order (llama.cpp's ``ggml_top_k``); the walks and trees order them by their scores.
    scores: float32 ``[D, K, K]``: ``scores[j, p, s]`` = the score of ``cand[j, s]`` after ``cand[j-1, p]``
        (j = 0: after the anchor; its K rows are equal).
    """

    cand: np.ndarray
    scores: np.ndarray

    def __post_init__(self) -> None:
        D, K = self.cand.shape
        if self.scores.shape != (D, K, K):
            raise ValueError(f"lattice scores {self.scores.shape} do not match candidates {self.cand.shape}")

    @property
    def depth(self) -> int:
        return int(self.cand.shape[0])

    def log_probs(self, temperature: float = 1.0) -> np.ndarray:
        """float64 ``[D, K, K]``: log softmax over successors of ``scores / temperature``."""
        x = self.scores.astype(np.float64) / temperature
        m = x.max(axis=2, keepdims=True)
        return x - (m + np.log(np.exp(x - m).sum(axis=2, keepdims=True)))


def greedy_walk(lat: Lattice, n: int) -> tuple[list[int], list[int]]:
    """The greedy path of ``min(n, D)`` positions: (tokens, candidate ranks)."""
    tokens, ranks, p = [], [], 0
    for j in range(min(n, lat.depth)):
        p = int(np.argmax(lat.scores[j, p]))
        tokens.append(int(lat.cand[j, p]))
        ranks.append(p)
    return tokens, ranks


def sample_walk(lat: Lattice, n: int, temperature: float, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """A path of ``min(n, D)`` positions drawn from the selector's chain at ``temperature`` > 0:
    (tokens, candidate ranks).

    Raises:
        ValueError: temperature <= 0 (use ``greedy_walk``).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for a sampled walk, got {temperature}")
    lp = lat.log_probs(temperature)
    tokens, ranks, p = [], [], 0
    for j in range(min(n, lat.depth)):
        p = int(rng.choice(lp.shape[2], p=np.exp(lp[j, p])))
        tokens.append(int(lat.cand[j, p]))
        ranks.append(p)
    return tokens, ranks


def chain_tree(root: int, lat: Lattice, tokens: list[int], ranks: list[int]) -> Tree:
    """The chain-shaped tree of a walk (``greedy_walk`` / ``sample_walk``), ``logp`` the selector's
    path log-probabilities."""
    lp = lat.log_probs()
    nodes, total, p = [], 0.0, 0
    for j, (t, s) in enumerate(zip(tokens, ranks)):
        total += float(lp[j, p, s])
        nodes.append((j, t, total))
        p = s
    return Tree.from_lists(root, nodes)


def build_lattice_tree(root: int, lat: Lattice, budget: int) -> Tree:
    """The best-first tree of ``budget`` drafted nodes over the lattice by path log-probability.

    Exact: every node's children are its candidate's successors sorted by log-probability, so the
    frontier needs only each popped node's best child and the popped node's next sibling.
    Ties go to the entry pushed first (heap order of (score, parent, rank)).

    Returns:
        the tree in pop order (parents before children); ``logp`` the path log-probabilities.
    """
    D = lat.depth
    if D == 0 or budget <= 0:
        return Tree.root(root)
    lp = lat.log_probs()
    order = np.argsort(-lp, axis=2, kind="stable")  # [D, K(pred), K]: successors best first
    order_l, lp_l, cand_l = order.tolist(), lp.tolist(), lat.cand.tolist()
    parents, toks, depth, path_lp, rank = [-1], [int(root)], [0], [0.0], [0]
    # entry: (-score, parent node, i-th best successor of the parent's candidate)
    heap = [(-lp_l[0][0][order_l[0][0][0]], 0, 0)]
    K = lat.cand.shape[1]
    while heap and len(parents) <= budget:
        neg, parent, i = heapq.heappop(heap)
        d, p = depth[parent], rank[parent]  # the new node sits at lattice row d (block position d + 1)
        s = order_l[d][p][i]
        node = len(parents)
        parents.append(parent)
        toks.append(int(cand_l[d][s]))
        depth.append(d + 1)
        path_lp.append(-neg)
        rank.append(s)
        if i + 1 < K:  # the parent's next-best child
            heapq.heappush(heap, (-(path_lp[parent] + lp_l[d][p][order_l[d][p][i + 1]]), parent, i + 1))
        if d + 1 < D:  # the new node's best child
            heapq.heappush(heap, (-(-neg + lp_l[d + 1][s][order_l[d + 1][s][0]]), node, 0))
    return Tree(np.array(parents, np.int32), np.array(toks, np.int32), np.array(depth, np.int32),
                np.array(path_lp, np.float64))


def selector_scorer(lat: Lattice) -> PathScorer:
    """The selector as DARTree's path scorer: a path of candidate ranks (one per depth, ``()`` = the
    root) → the log-probabilities of the next position's K candidates given its last candidate."""
    lp = lat.log_probs()

    def score(paths: list[tuple[int, ...]]) -> np.ndarray:
        return np.stack([lp[len(path), path[-1] if path else 0] for path in paths])

    return score
