"""Drafting methods: one object per method turns one drafter pass into a draft tree (``base.DraftMethod``),
built once from the user's options by ``factory.make_method``; the engine and the step hold the object.

- ``base``     the protocol (check_options / check_models, prepare, begin, draft, accept) and shared passes
- ``chain``    the DFlash chain (a DFlash2 drafter's: its lattice's greedy walk)
- ``marginal`` DDTree and the w-wide heap over the top-K marginals
- ``tfm``      TfM: the w-wide heap scored by the Weaver; the Weaver's state a step keeps; loading a Weaver
- ``dartree``  DARTree with the Weaver or a DFlash2 drafter's path selector as its head
- ``lattice``  a DFlash2 drafter's best-first tree over its selector's lattice
- ``factory``  the methods by name and ``make_method``
"""
from .base import DEFAULT_TREE_BUDGET, DraftMethod
from .factory import METHODS, TREE_SHAPES, check_method_options, make_method, method_class

__all__ = ["DEFAULT_TREE_BUDGET", "DraftMethod", "METHODS", "TREE_SHAPES", "check_method_options", "make_method",
           "method_class"]
