"""Lossless acceptance: walk a verified draft tree with the target's own choices.

Method (DDTree / SpecInfer style, docs/design.md §5): start at the root
(the last committed token); at each node take the target's token for the
next position — argmax at temperature 0, one sample from the target's
processed distribution otherwise — and move to the child carrying that token
if there is one, else stop. Every emitted token is the target's own choice
given the tokens before it, so the output (and its distribution) is the
target's whatever the tree. A chain is the tree with ``parents = [-1, 0, 1, ...]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Walk:
    """Result of one acceptance walk.

    path: node indices visited, root first (``len(path) - 1`` drafts accepted).
    tokens: tokens emitted, one per visited node (accepted drafts then the bonus token).
    """

    path: list[int]
    tokens: list[int]

    @property
    def n_accepted(self) -> int:
        return len(self.path) - 1


def children_lists(parents: np.ndarray, tokens: np.ndarray) -> list[dict[int, int]]:
    """Per node, a map child token → child node index. ``parents[0] == -1`` is the root."""
    kids: list[dict[int, int]] = [dict() for _ in range(len(parents))]
    for i in range(1, len(parents)):
        kids[int(parents[i])].setdefault(int(tokens[i]), i)
    return kids


def walk_tree(parents: np.ndarray, tokens: np.ndarray, choose: Callable[[int], int],
              max_tokens: int | None = None) -> Walk:
    """Walk the tree; ``choose(node)`` returns the target's token after ``node``.

    Args:
        parents: int array ``[N]``, topological (``parents[i] < i``), ``parents[0] = -1``.
        tokens: int array ``[N]``; ``tokens[0]`` is the root's (already committed) token.
        choose: target's choice at a node (reads that node's logits row).
        max_tokens: stop after emitting this many tokens (None = no limit).
    """
    kids = children_lists(parents, tokens)
    node, path, out = 0, [0], []
    while True:
        t = choose(node)
        out.append(t)
        nxt = kids[node].get(t)
        if nxt is None or (max_tokens is not None and len(out) >= max_tokens):
            return Walk(path, out)
        node = nxt
        path.append(node)
