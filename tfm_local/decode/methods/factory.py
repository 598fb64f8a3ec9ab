"""The one place the user's drafting options become a method object (``make_method``).

Adding a method: its file in this package (a ``base.DraftMethod`` subclass) and its class in ``METHODS``.
"""
from __future__ import annotations

from .base import DraftMethod
from .chain import Chain
from .dartree import DARTree
from .lattice import LatticeTree
from .marginal import DDTree, Wide
from .tfm import TfM

#: every method by its name in the user's options (``Engine(tree=...)``, ``--tree``), in the order help lists them
METHODS: dict[str, type[DraftMethod]] = {m.name: m for m in (Chain, DDTree, Wide, TfM, DARTree, LatticeTree)}
TREE_SHAPES = tuple(METHODS)


def method_class(tree: str) -> type[DraftMethod]:
    """The method class named ``tree`` (the one parse of the option). Raises ValueError for an unknown name."""
    try:
        return METHODS[tree]
    except (KeyError, TypeError):
        raise ValueError(f"unknown tree mode {tree!r}; choose one of {', '.join(TREE_SHAPES)}") from None


def check_method_options(tree: str, top_k: int, width: int, weaver: bool) -> type[DraftMethod]:
    """The method class of the user's options, checked before any model is loaded (``weaver``: a Weaver
    was given). Raises ValueError for an unknown name, a missing Weaver (``tree="tfm"``), or ``top_k`` or
    ``width`` below 1."""
    cls = method_class(tree)
    cls.check_options(weaver)
    if int(width) < 1 or int(top_k) < 1:
        raise ValueError(f"tree_width and tree_top_k must be >= 1 (got {width}, {top_k})")
    return cls


def make_method(tree: str = "chain", top_k: int = 8, width: int = 4, *, drafter=None, weaver=None,
                weaver_given: bool | None = None) -> DraftMethod:
    """The drafting method of the user's options, checked against what is loaded.

    Args:
        tree: the method's name (``TREE_SHAPES``). top_k: candidates per block position of the marginals.
        width: heap entries the w-wide heap expands together.
        drafter: the loaded ``draft.DFlashDrafter`` (None: none; the method then never drafts).
        weaver: the loaded ``weaver.TfmDrafter`` (None: none).
        weaver_given: a Weaver was given (default: ``weaver`` is loaded); an engine without a drafter
            loads none.
    Raises:
        ValueError: as ``check_method_options``, or a method the drafter and Weaver cannot give (DARTree
        without a Weaver or a DFlash2 drafter, the lattice tree with a DFlash drafter).
    """
    given = weaver is not None if weaver_given is None else weaver_given
    cls = check_method_options(tree, top_k, width, given)
    cls.check_models(drafter, given)
    return cls(top_k, width, weaver)
