"""What a verification pass returns: the draft tree's shape checked (``check_tree``), the target's logits
rows in node order without a copy (``NodeRows``), and the per-node result (``Verdict``: logits on the
host, or each node's token chosen in the target's graph). ``Target.verify`` (verify.py) builds them."""
from __future__ import annotations

from typing import Callable

import numpy as np


def check_tree(parents, depth, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``parents`` and ``depth`` of an ``n``-node draft tree as int64 arrays; ValueError unless the parents
    are in topological order (``-1 <= parents[i] < i``) and every depth is its parent's + 1 (roots 0).
    ``depth`` None: computed from the parents."""
    par = np.asarray(parents)
    dep = par if depth is None else np.asarray(depth)
    if par.shape != (n,) or dep.shape != (n,) or n == 0:
        raise ValueError(f"a tree needs parents and depth of shape ({n},) for its {n} tokens, "
                         f"got {par.shape} and {dep.shape}")
    if not (np.issubdtype(par.dtype, np.integer) and np.issubdtype(dep.dtype, np.integer)):
        raise ValueError(f"tree parents and depth must be integers, got {par.dtype} and {dep.dtype}")
    par = par.astype(np.int64)
    bad = np.flatnonzero((par < -1) | (par >= np.arange(n)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"tree parents must be in topological order (-1 <= parents[i] < i): "
                         f"parents[{i}] = {int(par[i])}")
    if depth is None:
        dep = np.zeros(n, np.int64)
        for i in range(1, n):
            if par[i] >= 0:
                dep[i] = dep[par[i]] + 1
        return par, dep
    dep = dep.astype(np.int64)
    want = np.where(par < 0, 0, dep[np.maximum(par, 0)] + 1)
    bad = np.flatnonzero(dep != want)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"tree depth[{i}] = {int(dep[i])}, expected {int(want[i])} (its parent's + 1, roots 0)")
    return par, dep


class NodeRows:
    """The logits of a tree batch in node order, without copying them: ``x[i]`` is node i's row
    ``[n_vocab]`` float32 (a view, valid until the next decode); ``np.asarray(x)`` gathers all
    ``[N, n_vocab]``. The engine reads the few nodes its walk visits; a gather of every row would
    copy N × n_vocab floats per step (39 MB for 64 nodes of a 152k vocabulary).
    """

    def __init__(self, view: np.ndarray, row: np.ndarray):
        self.view, self.row = view, row
        self.shape = (len(row), view.shape[1])

    def __len__(self) -> int:
        return len(self.row)

    def __getitem__(self, node):
        return self.view[self.row[node]]

    def __array__(self, dtype=None, copy=None):
        a = self.view[self.row]
        return a if dtype is None else a.astype(dtype)


class Verdict:
    """The target's verification of a tree's N nodes, in node order (``Target.verify``).

    logits: the nodes' rows ``[N, n_vocab]`` float32 (``x[i]`` node i's row; views valid until the next
        decode), or None when the backend's choices were read. ids: int32 ``[N]``, each node's token chosen
        in the target's graph (argmax or draw), or None when the logits were read. draw_pos: int64 ``[N]``,
        the position each node's next token is drawn for (``n_past + depth + 1``).
    """

    def __init__(self, logits=None, ids: np.ndarray | None = None, draw_pos: np.ndarray | None = None):
        self.logits, self.ids, self.draw_pos = logits, ids, draw_pos

    def choice(self, node: int, choose: Callable[[np.ndarray, int], int]) -> int:
        """The target's token after ``node``: the backend's choice, or ``choose(row, position)`` (the host
        rule, sampling.TokenChooser: argmax, or the draw for that position) on its logits row."""
        if self.ids is not None:
            return int(self.ids[node])
        return choose(self.logits[node], int(self.draw_pos[node]))

    def chooser(self, choose: Callable[[np.ndarray, int], int]) -> Callable[[int], int]:
        """``choice`` as a function of the node (what the acceptance walk takes)."""
        return lambda node: self.choice(node, choose)
