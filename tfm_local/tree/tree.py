"""The draft tree: parents, tokens, depths and path log-probabilities of its nodes."""
from __future__ import annotations

from dataclasses import dataclass

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
