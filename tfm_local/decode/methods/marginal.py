"""Trees from the drafter's per-position marginals alone: DDTree and the w-wide heap.

Methods: DDTree (arXiv 2604.12989, "diffusion draft trees"): the best-first tree of B nodes by path
log-probability over the top-K marginals ``[D, K]``; the w-wide heap (TfM, "trees from marginals",
arXiv 2607.06763): w frontier entries expanded together, ⌈B/w⌉ rounds (``decode.tree``). A DFlash2
drafter's DDTree stays over its marginals: the lattice tree's reference at equal budget.
"""
from __future__ import annotations

from ..tree import Tree, build_ddtree, build_wide
from .base import DraftMethod, marginal_tree


class DDTree(DraftMethod):
    """DDTree over the top-``top_k`` marginals (``tree.build_ddtree``)."""

    name = "ddtree"

    def draft(self, drafter, last: int, pos: int, budget: int, clock, path_logp: bool = True) -> Tree:
        """The best-first tree of ``budget`` drafted nodes over the marginals ``[D, top_k]``."""
        return marginal_tree(drafter, build_ddtree, self.top_k, last, pos, budget, clock)


class Wide(DraftMethod):
    """The w-wide heap over the top-``top_k`` marginals, ``width`` entries a round (``tree.build_wide``)."""

    name = "wide"

    def draft(self, drafter, last: int, pos: int, budget: int, clock, path_logp: bool = True) -> Tree:
        """The w-wide tree of ``budget`` drafted nodes over the marginals ``[D, top_k]``."""
        return marginal_tree(drafter, lambda *a: build_wide(*a, width=self.width), self.top_k, last, pos, budget,
                             clock)
