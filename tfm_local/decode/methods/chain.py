"""The chain: the drafter's most likely token at each block position.

Method: DFlash (arXiv 2602.06036; docs/design.md §2, §5): one block-diffusion pass drafts a whole block,
the chain is its argmax at each position (a degenerate tree). A DFlash2 drafter's chain is the greedy
walk of its path selector's lattice (z-lab DFlash2, as upstream llama.cpp drafts it; ``decode.lattice``).
"""
from __future__ import annotations

import numpy as np

from ..lattice import chain_tree, greedy_walk
from ..tree import Tree, build_chain
from .base import DraftMethod, is_dflash2, marginal_tree, selector_lattice


class Chain(DraftMethod):
    """The DFlash chain (a DFlash2 drafter's: its lattice's greedy walk); budgets up to the block."""

    name = "chain"

    def budget_bounds(self, block_size: int, n_batch: int) -> tuple[int, int]:
        """The drafter's block - 1 both: a chain is at most one block deep."""
        return block_size - 1, block_size - 1

    def draft(self, drafter, last: int, pos: int, budget: int, clock, path_logp: bool = True) -> Tree:
        """The chain of min(``budget``, block - 1) drafts; ``logp`` the top-1 marginals' (the selector's
        path log-probabilities for a DFlash2 drafter). Without ``path_logp`` a DFlash drafter's chain is
        its ``DFlashDrafter.draft_chain`` of ``budget`` tokens (at most block - 1), ``logp`` 0."""
        if is_dflash2(drafter):
            lat = selector_lattice(drafter, last, pos, budget, clock)
            return chain_tree(last, lat, *greedy_walk(lat, budget))
        if path_logp:
            return marginal_tree(drafter, build_chain, 1, last, pos, budget, clock)
        drafts = np.asarray(drafter.draft_chain(last, pos, budget), dtype=np.int64)
        clock.mark("drafter")
        return build_chain(last, drafts[:, None], np.zeros((len(drafts), 1)), budget)
