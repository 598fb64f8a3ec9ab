"""One decode step: draft → tree → verify → accept → commit, and the record it leaves.

The target's KV cache holds the committed tokens ``0 .. P-1``; ``last`` (the last emitted token)
is not in it yet and is the root of this step's tree. A step:

1. **budget** ``k`` drafted nodes (``draft_limit``; the automatic budget may pick fewer, 0 = plain);
2. **draft** one drafter pass over the block after ``last`` (draft.py) and **tree**: the drafting
   method's tree of ``k`` nodes (``methods``: the chain, DDTree or the w-wide heap over the top-K
   marginals ``[D, K]``, TfM and DARTree scored by a Weaver, a DFlash2 drafter's lattice trees), less
   the nodes a request's grammar rejects (``grammar.Grammar.cut``);
3. **verify** the tree ``[1 + k]`` nodes in one target pass (verify.py): the target's choice per node,
   by the generation's rule (backend argmax, or the host's argmax / sample of the node's logits);
4. **accept**: the lossless walk from the root along the target's choices (accept.py);
5. **commit** the accepted path in the target's cache and inject its features into the drafter's.

The target captures the drafter's layer inputs only in the steps that need them (``capture``): every
step of a fixed budget, and under the automatic budget the speculative steps and the plain steps just
before one (``StepPlan.capture``); a plain stretch then costs what plain decoding costs.

``run_step`` returns a ``StepRecord``; the statistics (``GenerationStats.add_step``) and the automatic
budget (``BudgetPolicy.observe``) read it. With no drafter, or ``k = 0``, the same step is plain decoding:
the tree is the root alone. Method and sources: docs/design.md §1 and §5.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .accept import walk_tree
from .budget import BudgetPolicy, StepPlan, gain_curve
from .draft import DFlashDrafter
from .methods import DraftMethod, make_method
from .stats import PHASES, PhaseClock
from .tree import Tree
from .verify import Target


@dataclass
class StepRecord:
    """What one step did (times in seconds, ``time.perf_counter``).

    pos: the target's committed length before the step (the root's position).
    budget: drafted nodes asked for (0 = a plain step). n_nodes: nodes verified, root included.
    tokens: the tokens emitted (accepted drafts, then the target's own token).
    curve: the drafter's gain curve ``[k_plan]`` for the automatic budget (None otherwise).
    phases: seconds per stage (``stats.PHASES``): drafter, tree, submit, verify, accept.
    probe: the automatic budget's probe. capture: the target pass captured the drafter's features.
    switched: the capture was turned on or off before the pass (llama.cpp re-reserved its scheduler
    in it, ~10 ms on the 2-core CPU). t_sync: seconds of the drafter's injection of rows deferred by
    earlier plain steps (part of phases["drafter"]). tree: the verified tree (``Tree.root(last)`` for a
    plain step; None until the step has verified), e.g. for ``Engine.on_step`` observers.
    """

    pos: int
    budget: int
    n_nodes: int
    tokens: list[int]
    curve: np.ndarray | None = None
    phases: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    probe: bool = False
    capture: bool = False
    switched: bool = False
    t_sync: float = 0.0
    tree: Tree | None = None

    @property
    def speculative(self) -> bool:
        """A draft was verified (False for a plain step)."""
        return self.budget > 0

    @property
    def n_accepted(self) -> int:
        """Drafted tokens accepted (the target's own token excluded)."""
        return len(self.tokens) - 1

    @property
    def t_draft(self) -> float:
        """Drafter time: the drafting pass, tree building and the KV injection of the accepted path."""
        return self.phases["drafter"] + self.phases["tree"]

    @property
    def t_step(self) -> float:
        """The step's timed phases together (seconds)."""
        return sum(self.phases.values())

    @property
    def t_verify(self) -> float:
        """Target time: submitting and waiting for the verification pass, the acceptance walk and commit."""
        return self.phases["submit"] + self.phases["verify"] + self.phases["accept"]


def draft_limit(budget: int, remaining: int, target: Target) -> int:
    """The most drafted nodes a step may verify: the budget, bounded by the tokens still wanted
    (``remaining`` includes the target's own token), the room in the context and one batch.

    On a GPU (``target.model.on_gpu``) the tokens still wanted bound it only when one is left: there
    a pass replays its CUDA graph only when its size is the last pass's, so a tree cut to the tokens
    still wanted at a generation's end cost a pass without the graph at each of its last steps and at
    the step after each (a third of DDTree@16's steps in 128-token generations on the H200); the
    acceptance walk still stops at ``remaining`` tokens. On the CPU a pass costs in proportion to its
    nodes, and the cut saves them."""
    wanted = remaining - 1 if not target.model.on_gpu or remaining <= 1 else budget
    return min(budget, wanted, target.n_ctx - target.n_past - 1, target.n_batch - 1)


def set_capture(target: Target, drafter: DFlashDrafter, on: bool) -> bool:
    """Turn the target's capture of ``drafter``'s layer inputs on or off; True when that changed it
    (llama.cpp then re-reserves its scheduler at the next decode)."""
    if bool(target.feature_layers) == on:
        return False
    target.set_features(drafter.layers if on else [])
    return True


def draft_tree(drafter: DFlashDrafter, method: DraftMethod, last: int, pos: int, k: int, k_plan: int,
               with_curve: bool, clock: PhaseClock, cut=None) -> tuple[Tree, np.ndarray | None]:
    """One drafter pass after ``last`` at position ``pos`` → a draft tree of at most ``k`` nodes (root
    excluded), built by the drafting ``method`` (``methods.DraftMethod.draft``).

    ``with_curve`` (automatic budget): the tree is first built for ``k_plan`` ≥ k nodes to get the gain
    curve ``[k_plan]`` (budget.gain_curve), then cut to its first ``k`` nodes; otherwise ``k_plan == k``
    and the curve is None. The caller bounds ``k_plan`` by the room in the context (``draft_limit``).
    ``cut``: None, or ``fn(tree) -> tree`` removing the nodes a request's grammar rejects
    (``HostChooser.cut``), applied first: the curve prices what can be accepted, and the budget's
    ``k`` nodes are allowed ones. ``clock`` gets the drafter pass ("drafter") and the tree building ("tree").
    """
    tree = method.draft(drafter, last, pos, k_plan, clock, path_logp=with_curve)
    if cut is not None:
        tree = cut(tree)
    curve = gain_curve(tree.logp[1:], k_plan) if with_curve else None
    tree = tree.truncate(k) if with_curve else tree
    clock.mark("tree")
    return tree, curve


#: the old name of ``methods.make_method``, for callers not yet moved to it (bench/replay.py)
DraftShape = make_method


def run_step(target: Target, drafter: DFlashDrafter | None, method: DraftMethod, budget: int,
             auto: BudgetPolicy | None, last: int, remaining: int, choose: Callable[[np.ndarray, int], int],
             backend_choice: bool) -> StepRecord:
    """One step after ``last`` (see the module doc); emits at most ``remaining`` tokens.

    Args:
        drafter: the drafter, or None for a plain step. method: the drafting method
            (``methods.make_method``; its ``accept`` learns the committed node after every step, plain
            ones included). budget: drafted nodes per step (``auto`` None) or the automatic budget's
            ceiling. auto: the automatic budget, or None for a fixed one.
        choose: the host rule ``(logits [n_vocab] float32, position) -> token`` (sampling.TokenChooser).
        backend_choice: read each node's token chosen in the target's graph instead (its argmax or its
            seeded draw: ``Target.attach_argmax`` / ``Target.attach_sampler`` first).
    """
    pos = target.n_past
    k_max = draft_limit(budget, remaining, target)
    plan = auto.plan(k_max, remaining) if auto is not None else StepPlan.fixed(k_max)
    k = plan.budget
    drafting = drafter is not None and k > 0
    capture = drafter is not None and (drafting or plan.capture)
    rec = StepRecord(pos=pos, budget=k if drafting else 0, n_nodes=1, tokens=[], capture=capture,
                     probe=drafting and plan.probe)
    clock = PhaseClock(rec.phases)
    if drafter is not None:
        rec.switched = set_capture(target, drafter, capture)
    # draft → tree
    if drafting:
        if drafter.pending:  # the rows deferred by the plain steps before: one batched injection
            drafter.flush()
            clock.mark("drafter")
            rec.t_sync = rec.phases["drafter"]
        tree, rec.curve = draft_tree(drafter, method, last, pos, k, plan.depth, plan.curve, clock,
                                     cut=getattr(choose, "cut", None))
    else:
        tree = Tree.root(last)
    # verify → accept → commit
    verdict = target.verify(tree.tokens, tree.parents, backend_choice=backend_choice,
                            on_submit=lambda: clock.mark("submit"))
    clock.mark("verify")
    walk = walk_tree(tree.parents, tree.tokens, verdict.chooser(choose), max_tokens=remaining)
    target.commit(walk.path)
    clock.mark("accept")
    # the accepted path's features into the drafter (a plain step's row waits for the next draft)
    if capture:
        features = target.features(target.rows(walk.path), len(tree))
        (drafter.inject if drafting else drafter.defer)(features, pos)
    method.accept(target, walk.path[-1])  # TfM: the next draft's prefix starts at the last committed node
    clock.mark("drafter")
    rec.n_nodes, rec.tokens, rec.tree = len(tree), walk.tokens, tree
    return rec

