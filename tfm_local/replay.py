"""Chain acceptance of drafters replayed on the target's recorded greedy outputs.

At temperature 0 speculative decoding emits exactly the target's greedy output (the lossless rule), so
what a chain step accepts depends only on the drafter and on that output: the step at the output's
token ``i`` drafts ``k`` tokens from it and accepts the longest prefix equal to the output's next
tokens, plus the target's own token after it. ``replay_chain`` walks an output that way with the
drafter's passes only: the target runs once per sequence (one prefill over prompt + output gives the
features of every position), not once per step, so comparing drafters (quantisations, checkpoints) on
the CPU costs a fraction of ``tfm-bench``. The step rule and the counts (``n_steps``, ``n_step_tokens``,
τ = their ratio) are the engine's (``Engine._step``); the features come from the prefill rather than
from the verify passes, and an output that ended at an end-of-generation token is not continued past
it, so the τ can differ from tfm-bench's in the last digits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    drafter.reset()
    n_gen, i, injected, accepted = 1, 0, 0, []
    while n_gen < max_tokens and i < len(output) - 1:
        remaining = max_tokens - n_gen
        k = min(budget, remaining - 1)
        pos = n_prompt + i
        a = 0
        if k > 0:
            drafter.inject(features[injected:pos], injected)
            injected = pos
            draft = drafter.draft_chain(int(output[i]), pos, k)
            ref = output[i + 1:i + 1 + k]
            while a < len(ref) and draft[a] == ref[a]:
                a += 1
        emitted = min(a + 1, remaining, len(output) - 1 - i)
        accepted.append(a)
        i += emitted
        n_gen += emitted
    return Replay(len(accepted), i, accepted)
