"""Logit processing and token choice shared by plain and speculative decoding.

The processed distribution follows llama.cpp's default sampler order
(``common/sampling.cpp``): top-k, then top-p and min-p on the softmax of the
raw logits, then temperature on the survivors. Sampling draws one uniform
number per emitted token and inverts the CDF in token-id order, so a
speculative run that visits the same positions consumes the same random
stream as plain decoding (see accept.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next-token distribution is processed.

    temperature: 0 → greedy (argmax of the raw logits); > 0 → sampling.
    top_k: keep the k most likely tokens (0 = off). top_p: nucleus mass (1 = off).
    min_p: drop tokens below min_p × p_max (0 = off). seed: RNG seed (None = random).
    Raises ValueError on out-of-range values.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_probs(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """Processed distribution of one logit row ``[n_vocab]`` → float64 probabilities (sum 1)."""
    x = logits.astype(np.float64)
    keep = np.ones(x.shape[0], dtype=bool)
    if sp.top_k and sp.top_k < x.shape[0]:
        kth = np.partition(x, -sp.top_k)[-sp.top_k]
        keep &= x >= kth
    if sp.top_p < 1.0 or sp.min_p > 0.0:
        p = np.exp(x - x[keep].max()) * keep
        p /= p.sum()
        if sp.min_p > 0.0:
            keep &= p >= sp.min_p * p.max()
        if sp.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            n_keep = int(np.searchsorted(cum, sp.top_p) + 1)
            nucleus = np.zeros_like(keep)
            nucleus[order[:n_keep]] = True
            keep &= nucleus
    z = np.where(keep, x / sp.temperature, -np.inf)
    q = np.exp(z - z.max())
    return q / q.sum()


def sample(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw in token-id order: the token whose CDF interval holds ``u`` ∈ [0, 1)."""
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return min(i, probs.shape[0] - 1)


class TokenChooser:
    """Chooses the target's token at a position: argmax (greedy) or a seeded sample.

    One uniform number is drawn per call, so plain and speculative decoding
    with the same seed read the same stream in the same order.
    """

    def __init__(self, sp: SamplingParams):
        self.sp = sp
        self.rng = np.random.default_rng(sp.seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.sp.greedy:
            return int(np.argmax(logits))
        return sample(target_probs(logits, self.sp), float(self.rng.random()))
