"""Chain acceptance of drafters replayed on the target's recorded greedy outputs.

At temperature 0 speculative decoding emits exactly the target's greedy output (the lossless rule), so
what a chain step accepts depends only on the drafter and on that output: the step at the output's
token ``i`` drafts ``k`` tokens from it and accepts the longest prefix equal to the output's next
tokens, plus the target's own token after it. ``replay_chain`` walks an output that way with the
drafter's passes only: the target runs once per sequence (one prefill over prompt + output gives the
features of every position), not once per step, so comparing drafters (quantisations, checkpoints) on
the CPU costs a fraction of ``tfm-bench``. The step rule and the counts (``n_steps``, ``n_step_tokens``,
τ = their ratio) are the engine's: the draft size (``step.draft_limit``'s rule without the context
bounds), the drafter's tree (``step.draft_tree``) and the acceptance walk (``accept.walk_tree``) with the
recorded output as the target's choice; the features come from the prefill rather than
from the verify passes, and an output that ended at an end-of-generation token is not continued past
it, so the τ can differ from tfm-bench's in the last digits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..decode.accept import walk_tree
from ..decode.stats import PHASES, PhaseClock
from ..decode.step import DraftShape, draft_tree
from ..decode.tree import Tree


@dataclass
class Replay:
    """One output replayed: ``n_steps`` chain steps emitting ``n_step_tokens`` tokens (the first output
    token, from the prefill, is no step) and the tokens accepted per step."""

    n_steps: int
    n_step_tokens: int
    accepted: list[int]

    @property
    def tau(self) -> float:
        """Acceptance length τ: tokens per step (0 without steps)."""
        return self.n_step_tokens / self.n_steps if self.n_steps else 0.0


def sequence_features(target, ids: list[int]) -> np.ndarray:
    """Target features ``[len(ids), n_layers * n_embd]`` float32 of every position of ``ids`` (one prefill;
    the target's feature layers must be set, e.g. by constructing a ``DFlashDrafter`` on it)."""
    parts: list[np.ndarray] = []
    target.prefill(list(ids), lambda s, n: parts.append(target.features(slice(0, n), n).copy()))
    return np.concatenate(parts)


def replay_chain(drafter, features: np.ndarray, n_prompt: int, output: list[int], max_tokens: int,
                 budget: int | None = None) -> Replay:
    """Replay the greedy chain over ``output`` (the target's greedy tokens after an ``n_prompt``-token prompt).

    Args:
        drafter: a ``DFlashDrafter`` on the target that gave ``features``.
        features: ``sequence_features`` of prompt + output ``[n_prompt + len(output), F]``.
        max_tokens: the generation's cap (as tfm-bench's ``--max-tokens``): the last steps draft fewer.
        budget: drafts per step (default ``block_size - 1``, the chain's).
    Returns:
        the ``Replay``.
    Raises:
        ValueError: ``features`` shorter than prompt + output, or an empty output.
    """
    if not output:
        raise ValueError("nothing to replay: the output is empty")
    if len(features) < n_prompt + len(output):
        raise ValueError(f"{len(features)} feature rows for {n_prompt} prompt + {len(output)} output tokens")
    budget = drafter.block_size - 1 if budget is None else budget
    shape, clock = DraftShape("chain"), PhaseClock(dict.fromkeys(PHASES, 0.0))
    drafter.reset()
    n_gen, i, injected, accepted = 1, 0, 0, []
    while n_gen < max_tokens and i < len(output) - 1:
        remaining = max_tokens - n_gen
        k = min(budget, remaining - 1)
        pos = n_prompt + i
        tree = Tree.root(int(output[i]))
        if k > 0:
            drafter.inject(features[injected:pos], injected)
            injected = pos
            tree, _ = draft_tree(drafter, shape, int(output[i]), pos, k, k, False, clock)
        at = i  # the target's token after node n of a chain at output[at] is output[at + 1 + n]
        walk = walk_tree(tree.parents, tree.tokens, lambda n: int(output[at + 1 + n]),
                         max_tokens=min(remaining, len(output) - 1 - i))
        # drafts equal to the output (one more than the walk's n_accepted where the output's end cut it)
        drafts = tree.tokens[1:1 + len(walk.tokens)]
        accepted.append(int(np.argmin(np.append(drafts == walk.tokens[:len(drafts)], False))))
        i += len(walk.tokens)
        n_gen += len(walk.tokens)
    return Replay(len(accepted), i, accepted)
