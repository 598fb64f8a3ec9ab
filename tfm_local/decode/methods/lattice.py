"""The DFlash2 lattice tree: the exact best-first tree over a DFlash2 drafter's selector lattice.

Method: DFlash2 (z-lab; docs/design.md §5 and §7): the path selector scores each candidate given the
one before, a first-order chain over the top-K candidates of each block position; the tree of B nodes
by path log-probability is built best-first as DDTree is over marginals (``decode.lattice``).
"""
from __future__ import annotations

from ..lattice import build_lattice_tree
from ..tree import Tree
from .base import DraftMethod, is_dflash2, selector_lattice

#: why a DFlash drafter cannot draft the lattice tree
LATTICE_NEEDS = ('tree="lattice" needs a DFlash2 drafter (the tree is built over its path selector\'s lattice); '
                 'a DFlash drafter\'s best-first tree is tree="ddtree"')


class LatticeTree(DraftMethod):
    """A DFlash2 drafter's best-first lattice tree (``lattice.build_lattice_tree``)."""

    name = "lattice"

    @classmethod
    def check_models(cls, drafter, weaver: bool) -> None:
        """Raises ValueError for a DFlash drafter (without one the method never drafts)."""
        if drafter is not None and not is_dflash2(drafter):
            raise ValueError(LATTICE_NEEDS)

    def draft(self, drafter, last: int, pos: int, budget: int, clock, path_logp: bool = True) -> Tree:
        """The best-first tree of ``budget`` drafted nodes over the lattice. Raises ValueError for a
        DFlash drafter."""
        if not is_dflash2(drafter):
            raise ValueError(LATTICE_NEEDS)
        return build_lattice_tree(last, selector_lattice(drafter, last, pos, budget, clock), budget)
