"""Log-probabilities of emitted tokens: the log-softmax of the logit row a token was chosen from.

The value reported for a token at a position is ``log softmax(x)[token]`` computed in float64 over the
full vocabulary, ``x`` being the target's logits at that position after the penalties (``penalties``)
and before the temperature and the top-k / top-p / min-p filters: the distribution a temperature of 1
without filters would sample from. It does not depend on the sampling settings (as OpenAI's values do
not), nor on the draft: speculative and plain decoding that emit the same tokens read the same target
rows (up to the float rounding of a batched pass).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: The most alternatives per token (OpenAI's limit for ``top_logprobs``).
MAX_TOP_LOGPROBS = 20


@dataclass
class TokenLogprob:
    """One emitted token's record.

    token: its id. logprob: its log-probability (natural log, <= 0). top: the ``top_logprobs`` most likely
    tokens at its position as (id, log-probability), most likely first (ties: lower id first); the emitted
    token is among them only if it ranks there. text_offset: where its text starts in the generated text
    (characters), set by ``Engine.generate``; None from ``generate_ids``.
    """

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    text_offset: int | None = None


def check_top_logprobs(n) -> int:
    """``n`` as an int in 0..MAX_TOP_LOGPROBS; ValueError otherwise (a bool or a float included)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs (alternatives per token) must be an integer in 0..{MAX_TOP_LOGPROBS}, got {n!r}")
    return int(n)


def token_logprob(logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """The record of ``token`` chosen from the logit row ``logits`` ``[n_vocab]`` (float32, already penalised)
    with its ``n_top`` (0..MAX_TOP_LOGPROBS) most likely alternatives; log-softmax in float64."""
    x = np.asarray(logits)
    m = np.float64(x.max())
    lse = m + np.log(np.sum(np.exp(x.astype(np.float64) - m)))
    top: list[tuple[int, float]] = []
    if n_top > 0:
        n = min(n_top, x.shape[0])
        cut = np.partition(x, -n)[-n]  # the n-th largest logit; tokens tied with it by ascending id
        above, tied = np.flatnonzero(x > cut), np.flatnonzero(x == cut)
        ids = np.concatenate([above, tied[:n - above.size]])
        ids = ids[np.lexsort((ids, -x[ids]))]
        top = [(int(i), float(np.float64(x[i]) - lse)) for i in ids]
    return TokenLogprob(int(token), float(np.float64(x[token]) - lse), top)
