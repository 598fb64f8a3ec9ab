"""DARTree: depth-wise expansion of W live branches, scored by a correction head, then one global top-B.

Method: DARTree (arXiv 2608.13524; docs/design.md §5): depth by depth, the candidates of every live
branch are scored in one head call, the W best branches stay live, and the B best nodes of the whole
supertree by path score + beta · depth are kept (``tree.build_dartree``). Its head is the Weaver
(``decode.weaver``: built on the Weaver's backend in one call, ``weaver.TfmDrafter.dartree``) or a
DFlash2 drafter's path selector (``lattice.selector_scorer``, z-lab DFlash2).
"""
from __future__ import annotations

from ..lattice import selector_scorer
from ..tree import Tree, build_dartree
from .base import DEFAULT_TREE_BUDGET, WEAVER_HOW, is_dflash2, selector_lattice
from .tfm import WeaverMethod


class DARTree(WeaverMethod):
    """DARTree with the Weaver as its head when one is loaded, else a DFlash2 drafter's selector."""

    name = "dartree"

    @classmethod
    def check_models(cls, drafter, weaver: bool) -> None:
        """Raises ValueError without a Weaver or a DFlash2 drafter."""
        if not weaver and not is_dflash2(drafter):
            raise ValueError(f'tree="{cls.name}" needs a correction head: a Weaver ({WEAVER_HOW}) '
                             'or a DFlash2 drafter (its path selector)')

    @classmethod
    def weaver_timing(cls, target_path: str) -> dict:
        """A DARTree of the default budget built on the backend (one graph a tree)."""
        return {"budget": DEFAULT_TREE_BUDGET, "dartree_target": str(target_path)}

    def prepare(self, target) -> None:
        """As ``WeaverMethod``, and the Weaver's backend made ready to build whole trees
        (``weaver.TfmDrafter.attach``: its step-input table, once)."""
        super().prepare(target)
        if self.weaver is not None:
            self.weaver.attach()

    def draft(self, drafter, last: int, pos: int, budget: int, clock, path_logp: bool = True) -> Tree:
        """Without a Weaver, a DFlash2 drafter's DARTree over its lattice with the selector as the head;
        else as ``WeaverMethod.draft``."""
        if self.weaver is None and is_dflash2(drafter):
            lat = selector_lattice(drafter, last, pos, budget, clock)
            return build_dartree(last, lat.cand, budget, selector_scorer(lat))
        return super().draft(drafter, last, pos, budget, clock, path_logp)

    def weave(self, last, cand, logp, hidden, budget) -> Tree:
        return self.weaver.dartree(last, self.h_target, cand, logp, hidden, budget)
