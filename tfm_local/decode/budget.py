"""Automatic draft budget: choose B (or plain decoding) from measured pass costs and acceptance.

Speculation pays only when the tokens a step emits outweigh what the step
costs. Per step, with a budget of B drafted tokens:

    rate(B) = (1 + r · g(B)) / (c(B + 1) + d)        tokens per second
    rate(0) = 1 / c(1)                                plain decoding

* ``c(n)``: seconds of one target pass over n tokens (tree nodes), measured
  on this machine as the engine runs (``PassCosts``: a running mean per n,
  piecewise-linear in between, extended with the slope of the last segment).
  On a 2-core CPU c(n) grows almost linearly with n; on a GPU it is nearly
  flat up to ~64, which is why the best B differs so much between them.
* ``d``: seconds of drafting (drafter pass, top-K, tree build, KV injection).
* ``g(B)``: the drafter's own prediction of the drafted tokens accepted with
  a budget B: the sum of the B largest path probabilities of the best-first
  tree (DDTree, arXiv 2604.12989: the best-first tree of B nodes maximises
  exactly this sum); for the chain, Σ_k Π_{j≤k} p_j of the top-1 tokens.
  Averaged over recent steps.
* ``r``: calibration, running accepted / predicted at the budgets used (the
  drafter is rarely calibrated; above temperature 0 acceptance also differs).

When plain decoding wins, the drafter is still probed now and then (after 8,
16, 32 … 256 plain steps, with the best speculative budget) so the statistics
follow the text. A probe drafts only as deep as its budget (``probing``), so
it costs one short drafter pass and one short verification; the gains of
deeper budgets are then extrapolated from it (``extrapolate``). Between probes
only the one-token cost changes, so a "plain" choice is re-evaluated every
``recheck`` steps rather than on each (it cost ~0.1 ms a step in Python, 5%
of a plain step on the H200). The choice never changes the output: every
step is verified losslessly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class PassCosts:
    """Measured seconds of one target pass by its token count n.

    ``record(n, s)`` keeps an exponential moving average per n (weight
    ``alpha`` for the new sample); ``estimate(n)`` interpolates linearly
    between measured n, extends past the largest with the slope of the last
    segment (never below the last value) and below the smallest with the
    smallest's value. Units: seconds.
    """

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self._mean: dict[int, float] = {}

    def record(self, n: int, seconds: float) -> None:
        """Add one measured pass of ``n`` tokens (n ≥ 1) that took ``seconds``."""
        if n < 1 or not seconds > 0:
            return
        old = self._mean.get(n)
        self._mean[n] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds

    def known(self, n: int) -> bool:
        """Whether a pass of exactly ``n`` tokens was measured."""
        return n in self._mean

    def estimate(self, n: int | np.ndarray) -> float | np.ndarray | None:
        """Estimated seconds of a pass over ``n`` tokens (scalar or array); None before any record."""
        if not self._mean:
            return None
        xs = np.array(sorted(self._mean), dtype=np.float64)
        ys = np.array([self._mean[int(x)] for x in xs])
        q = np.asarray(n, dtype=np.float64)
        out = np.interp(q, xs, ys)
        if len(xs) >= 2:
            slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
            out = np.where(q > xs[-1], ys[-1] + slope * (q - xs[-1]), out)
        return float(out) if np.ndim(out) == 0 else out


def gain_curve(path_logp: np.ndarray, length: int) -> np.ndarray:
    """Predicted accepted drafted tokens for budgets 1..``length``: float64 ``[length]``.

    Args:
        path_logp: path log-probabilities of the drafted nodes in best-first
            (pop) order, root excluded, so that the first B nodes form the
            budget-B tree. Shorter than ``length``: the curve stays flat.
    """
    return _extend(np.cumsum(np.exp(np.asarray(path_logp, dtype=np.float64)))[:length], length)


def _extend(curve: np.ndarray, n: int) -> np.ndarray:
    """``curve`` (a gain curve: non-decreasing) continued flat to length ``n`` (0 when empty); longer is kept."""
    if len(curve) >= n:
        return curve
    return np.concatenate([curve, np.full(n - len(curve), curve[-1] if len(curve) else 0.0)])


def best_budget(costs: PassCosts, draft_s: float, curve: np.ndarray, ratio: float, k_max: int,
                margin: float = 1.03, speculative_only: bool = False) -> int:
    """The budget in 0..``k_max`` with the highest predicted tokens per second.

    Args:
        costs: measured pass costs (must hold at least one record).
        draft_s: seconds of drafting per speculative step.
        curve: ``gain_curve`` ``[≥ k_max]``. ratio: calibration r.
        margin: speculation must beat plain decoding by this factor (noise guard).
        speculative_only: best B ≥ 1 even when plain decoding would win (probes).
    Returns:
        0 for plain decoding, else B.
    """
    if k_max < 1:
        return 0
    b = np.arange(1, k_max + 1)
    rate = (1.0 + ratio * curve[:k_max]) / (np.asarray(costs.estimate(b + 1)) + draft_s)
    i = int(np.argmax(rate))
    if speculative_only:
        return int(b[i])
    return int(b[i]) if rate[i] > margin / costs.estimate(1) else 0


def extrapolate(curve: np.ndarray, n: int) -> np.ndarray:
    """A gain curve measured to a depth shorter than ``n`` (a probe drafts only its budget deep)
    continued to length ``n`` as a chain continues: each further position adds the last increment
    times q, q = the ratio of the last two increments (one point: q = the curve's first value, its
    acceptance rate), clamped to [0, 0.95]. A flat continuation instead would price every deeper
    budget as worthless, so probes at budget 1 could never show that budget 3 pays. Float64 ``[n]``;
    a curve of length ≥ ``n`` is returned as it is.
    """
    c = np.asarray(curve, dtype=np.float64)
    if len(c) >= n or len(c) == 0:
        return _extend(c, n)
    inc = np.diff(np.concatenate([[0.0], c]))
    q = inc[-1] / inc[-2] if len(inc) >= 2 and inc[-2] > 0 else c[0]
    extra = inc[-1] * np.clip(q, 0.0, 0.95) ** np.arange(1, n - len(c) + 1)
    return np.concatenate([c, c[-1] + np.cumsum(extra)])


@dataclass
class AutoBudget:
    """Per-step budget chooser (state kept across generations of one Engine).

    Args:
        first_probe: budget of the first speculative step, before any statistics.
    Attributes:
        probing: the last ``choose`` returned a probe (the engine then drafts
            only ``B`` deep instead of computing the whole gain curve).
        probe_min / probe_max: plain steps between probes (doubling while plain keeps winning).
        recheck: plain steps a "plain wins" decision is kept before it is computed again (a
            speculative step's statistics clear it at once).
        alpha: weight of a new sample in the running means.
    """

    first_probe: int = 1
    probe_min: int = 8
    probe_max: int = 256
    recheck: int = 8
    alpha: float = 0.2
    costs: PassCosts = field(default_factory=PassCosts)
    draft_s: float | None = None
    curve: np.ndarray | None = None
    accepted: float = 0.0
    predicted: float = 0.0
    probing: bool = False
    _since_probe: int = 0
    _probe_every: int = 8
    _plain_kept: int = 0

    @property
    def ratio(self) -> float:
        """Calibration r = accepted / predicted (1 before data), clamped to [0.02, 2]."""
        if self.predicted <= 0:
            return 1.0
        return float(np.clip(self.accepted / self.predicted, 0.02, 2.0))

    def choose(self, k_max: int) -> int:
        """Budget for the next step, at most ``k_max`` (0 = plain decoding)."""
        self.probing = False
        if k_max < 1 or not self.costs.known(1):
            return 0  # the first step measures a plain pass
        if self.curve is None or self.draft_s is None:
            self.probing = True
            return min(self.first_probe, k_max)
        b = self._decide(k_max)
        if b > 0:
            self._since_probe, self._probe_every = 0, self.probe_min
            return b
        self._since_probe += 1
        if self._since_probe <= self._probe_every:
            return 0
        self._since_probe, self._probe_every = 0, min(2 * self._probe_every, self.probe_max)
        self.probing = True
        return best_budget(self.costs, self.draft_s, self._curve(k_max), self.ratio, k_max,
                           speculative_only=True)

    def _decide(self, k_max: int) -> int:
        """``best_budget`` now, or 0 while an earlier "plain wins" is kept (``recheck``)."""
        if self._plain_kept > 0:
            self._plain_kept -= 1
            return 0
        b = best_budget(self.costs, self.draft_s, self._curve(k_max), self.ratio, k_max)
        self._plain_kept = self.recheck - 1 if b == 0 else 0
        return b

    def observe(self, rec) -> None:
        """Learn from one decode step (a ``step.StepRecord``): a plain step's pass cost, or a speculative
        step's pass cost, drafting time, gain curve and acceptance."""
        if rec.speculative:
            self.observe_spec(rec.n_nodes, rec.t_verify, rec.t_draft, rec.curve, rec.budget, rec.n_accepted)
        else:
            self.observe_plain(rec.t_verify)

    def observe_plain(self, seconds: float) -> None:
        """A plain step's target pass (1 token) took ``seconds``."""
        self.costs.record(1, seconds)

    def observe_spec(self, n_nodes: int, verify_s: float, draft_s: float, curve: np.ndarray,
                     budget: int, accepted: int) -> None:
        """A speculative step: ``n_nodes`` verified in ``verify_s``, drafting took ``draft_s``,
        ``curve`` its gain curve, ``budget`` drafted tokens of which ``accepted`` were accepted."""
        a = self.alpha
        self._plain_kept = 0
        self.costs.record(n_nodes, verify_s)
        self.draft_s = draft_s if self.draft_s is None else (1 - a) * self.draft_s + a * draft_s
        self.curve = self._blend(self.curve, curve, a)
        pred = float(curve[budget - 1]) if budget >= 1 else 0.0
        self.accepted = (1 - a) * self.accepted + a * accepted if self.predicted else float(accepted)
        self.predicted = (1 - a) * self.predicted + a * pred if self.predicted else pred

    def _curve(self, k_max: int) -> np.ndarray:
        return extrapolate(self.curve[:k_max], k_max)

    @staticmethod
    def _blend(old: np.ndarray | None, new: np.ndarray, a: float) -> np.ndarray:
        if old is None:
            return np.asarray(new, dtype=np.float64).copy()
        n = max(len(old), len(new))
        return (1 - a) * extrapolate(old, n) + a * extrapolate(new, n)
