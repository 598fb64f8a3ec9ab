"""The drafting protocol: one object per drafting method, turning one drafter pass into a draft tree.

A method is what a decode step asks for its tree (``step.draft_tree``): ``draft`` runs the drafter's
pass after the last emitted token and builds a ``Tree`` of the budget's drafted nodes. A method keeps
what must outlive a step (TfM's and DARTree's target state for the Weaver) and learns each step's
committed node from ``accept``. Each is built and checked once, by ``factory.make_method`` from the
user's options, so that the engine and the step hold an object and never compare names: llama.cpp's
``common/speculative`` keeps one implementation object per method behind begin / draft / accept, and
vLLM's ``v1/spec_decode`` one proposer per file.

Life of a method: ``check_options`` (the user's options alone, before any model is loaded),
``check_models`` (against the loaded drafter and Weaver), construction, ``prepare(target)`` (what the
target must keep for it); per generation ``begin()``; per step ``draft`` (speculative steps only), then
``accept`` (every step, plain ones included).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, ClassVar

import numpy as np

from ..stats import PhaseClock
from ..tree import Tree

if TYPE_CHECKING:  # annotations only: the methods load no model
    from ..draft import DFlashDrafter
    from ..lattice import Lattice
    from ..verify import Target
    from ..weaver import TfmDrafter

#: Drafted nodes a tree step verifies when the budget is left to the default (a chain's is its block).
DEFAULT_TREE_BUDGET = 63

#: How a user gives the engine a Weaver, for the methods' errors.
WEAVER_HOW = '--weaver WEAVER.gguf in the tools, Engine(..., weaver="weaver.gguf") in Python'

#: A tree builder over the marginals: ``(root, cand int [D, K], logp float [D, K], budget) -> Tree``.
Builder = Callable[[int, np.ndarray, np.ndarray, int], Tree]


def is_dflash2(drafter: DFlashDrafter | None) -> bool:
    """The drafter is a DFlash2 drafter (it has a path selector: ``DFlashDrafter.selector_top_k`` > 0)."""
    return drafter is not None and drafter.selector_top_k > 0


def marginal_tree(drafter: DFlashDrafter, build: Builder, k: int, last: int, pos: int, budget: int,
                  clock: PhaseClock) -> Tree:
    """One drafter pass after ``last`` at ``pos`` (``DFlashDrafter.top_k``: its top-``k`` marginals
    ``[D, k]``, D = min(block - 1, budget): a tree of ``budget`` nodes is at most that deep, clock
    "drafter"), then ``build(last, cand, logp, budget)``."""
    cand, logp = drafter.top_k(last, pos, min(drafter.block_size - 1, budget), k)
    clock.mark("drafter")
    return build(last, cand, logp, budget)


def selector_lattice(drafter: DFlashDrafter, last: int, pos: int, budget: int, clock: PhaseClock) -> Lattice:
    """One DFlash2 drafter pass after ``last`` at ``pos``: its selector's lattice over min(block - 1,
    ``budget``) positions (``DFlashDrafter.lattice``; clock "drafter"). Raises ValueError for a DFlash drafter."""
    lat = drafter.lattice(last, pos, min(drafter.block_size - 1, budget))
    clock.mark("drafter")
    return lat


class DraftMethod:
    """A drafting method (the protocol; one subclass a method, one file each).

    Args:
        top_k: candidates per block position of the marginals ``[D, K]`` (the engine's ``tree_top_k``).
        width: heap entries the w-wide heap expands together (the engine's ``tree_width``).
        weaver: the loaded Weaver's ``weaver.TfmDrafter`` (None: none); the methods it scores keep it.
    Attributes:
        name: the method's name in the user's options (``Engine(tree=...)``, ``--tree``).
    """

    name: ClassVar[str] = ""

    def __init__(self, top_k: int = 8, width: int = 4, weaver: TfmDrafter | None = None):
        self.top_k, self.width = int(top_k), int(width)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(top_k={self.top_k}, width={self.width})"

    @classmethod
    def check_options(cls, weaver: bool) -> None:
        """Raise ValueError when the user's options alone cannot give this method (before any model is
        loaded); ``weaver``: a Weaver was given."""

    @classmethod
    def check_models(cls, drafter: DFlashDrafter | None, weaver: bool) -> None:
        """Raise ValueError when the loaded drafter (None: none, the method then never drafts) and
        Weaver cannot give this method (``check_options`` included)."""
        cls.check_options(weaver)

    @classmethod
    def weaver_timing(cls, target_path: str) -> dict:
        """The tree the engine times to place a Weaver at load (``weaver.fastest_weaver``'s ``budget`` and
        ``dartree_target``): a TfM tree of 16 nodes, unless the method builds DARTree on the backend."""
        return {"budget": 16, "dartree_target": None}

    def budget_bounds(self, block_size: int, n_batch: int) -> tuple[int, int]:
        """(default, ceiling) of drafted nodes a step for a drafter of ``block_size`` and a target batch of
        ``n_batch``: a tree's ``DEFAULT_TREE_BUDGET``, and one batch with its root."""
        return DEFAULT_TREE_BUDGET, n_batch - 1

    def prepare(self, target: Target) -> None:
        """Make ``target`` keep what this method reads (the engine calls it when the method is chosen):
        here nothing, so the target's final hidden states are off."""
        target.set_final_hidden(False)

    def begin(self) -> None:
        """A generation begins: forget what the last one left (here nothing)."""

    def draft(self, drafter: DFlashDrafter, last: int, pos: int, budget: int, clock: PhaseClock,
              path_logp: bool = True) -> Tree:
        """One drafter pass after ``last`` (the last emitted token, the root) at the target's committed
        length ``pos`` → a ``Tree`` of at most ``budget`` >= 1 drafted nodes, parents before children;
        ``logp`` the drafter's path log-probabilities (the automatic budget's gain curve), which a method
        may leave 0 when ``path_logp`` is False (no curve wanted). ``clock`` gets the drafter pass
        ("drafter"); the caller marks the tree's building.

        Raises ValueError when ``drafter`` cannot draft this method."""
        raise NotImplementedError

    def accept(self, target: Target, node: int) -> None:
        """The step's accepted path is committed; ``node`` is the verified row of its last node (the
        target's state there: ``Target.final_hidden``). Called after every step, plain ones included."""
