"""Draft trees built from the drafter's per-position marginals, and their builders.

A tree is node 0 = the root (last committed token) plus drafted nodes in
topological order; node i sits at position P + depth(i). Builders share one
interface: ``build(cand_tokens, cand_logp, budget) -> Tree``, where
``cand_tokens / cand_logp`` are the top-K candidates of each block position
(``[D, K]``, position d is depth d + 1) and ``budget`` the number of drafted
nodes (root excluded).
"""
from .builders import BUILDERS, build_chain, build_ddtree, build_wide
from .tree import Tree

__all__ = ["Tree", "BUILDERS", "build_chain", "build_ddtree", "build_wide"]
