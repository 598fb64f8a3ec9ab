"""The gain curve, its calibration, and the predicted rate of a budget.

Per step, with a budget of B drafted tokens (docs/design.md §5):

    rate(B) = (1 + r · g(B)) / (c(B + 1) + d)        tokens per second
    rate(0) = 1 / c(1)                                plain decoding

* ``c(n)``: seconds of a target pass over n tokens (``costs.PassCosts``); ``d``: seconds of drafting.
* ``g(B)``: the drafter's own prediction of the drafted tokens accepted with a budget B: the sum of the
  B largest path probabilities of the best-first tree (DDTree, arXiv 2604.12989: the best-first tree of
  B nodes maximises exactly this sum); for the chain, Σ_k Π_{j≤k} p_j of the top-1 tokens. A running
  blend of recent steps' curves (``GainModel``).
* ``r``: calibration, running accepted / predicted at the budgets used (the drafter is rarely
  calibrated; above temperature 0 acceptance also differs), from a prior of one token each.
"""
from __future__ import annotations

import numpy as np

from .config import BudgetConfig
from .costs import PassCosts


def gain_curve(path_logp: np.ndarray, length: int) -> np.ndarray:
    """Predicted accepted drafted tokens for budgets 1..``length``: float64 ``[length]``.

    Args:
        path_logp: path log-probabilities of the drafted nodes in best-first
            (pop) order, root excluded, so that the first B nodes form the
            budget-B tree. Shorter than ``length``: the curve stays flat.
    """
    return extend(np.cumsum(np.exp(np.asarray(path_logp, dtype=np.float64)))[:length], length)


def extend(curve: np.ndarray, n: int) -> np.ndarray:
    """``curve`` (a gain curve: non-decreasing) continued flat to length ``n`` (0 when empty); longer is kept."""
    if len(curve) >= n:
        return curve
    return np.concatenate([curve, np.full(n - len(curve), curve[-1] if len(curve) else 0.0)])


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
        return extend(c, n)
    inc = np.diff(np.concatenate([[0.0], c]))
    q = inc[-1] / inc[-2] if len(inc) >= 2 and inc[-2] > 0 else c[0]
    extra = inc[-1] * np.clip(q, 0.0, 0.95) ** np.arange(1, n - len(c) + 1)
    return np.concatenate([c, c[-1] + np.cumsum(extra)])


def blend(old: np.ndarray | None, new: np.ndarray, a: float, depth: int | None = None) -> np.ndarray:
    """The running curve ``old`` moved towards ``new`` by weight ``a`` (both extrapolated to the longer
    length); beyond ``depth`` (the old curve's measured depth, when below ``new``'s) the result follows
    ``new``'s increments from there, so it never falls."""
    if old is None:
        return np.asarray(new, dtype=np.float64).copy()
    n = max(len(old), len(new))
    nw = extrapolate(new, n)
    out = (1 - a) * extrapolate(old, n) + a * nw
    if depth is not None and 0 < depth < len(new):  # beyond the old curve's measured depth: the new
        out[depth:] = out[depth - 1] + nw[depth:] - nw[depth - 1]  # curve's increments (never falling)
    return out


def draft_seconds(draft_s, b) -> float | np.ndarray:
    """The drafting seconds of a step with budgets ``b``: ``draft_s`` itself when it is a number (one cost
    at every budget), else ``draft_s(b)`` (a function of the budgets array, ``BudgetPolicy.drafting``)."""
    return draft_s(np.asarray(b, dtype=np.int64)) if callable(draft_s) else draft_s


def predicted_rate(costs: PassCosts, draft_s, curve: np.ndarray, ratio: float, b) -> np.ndarray:
    """Predicted tokens per second of budgets ``b`` (int, scalar or ``[m]`` ≥ 1): ``(1 + r·g(B)) /
    (c(B+1) + d(B))`` (docs/design.md §5); ``draft_s``: d, seconds or a function of B (``draft_seconds``)."""
    b = np.asarray(b, dtype=np.int64)
    return (1.0 + ratio * np.asarray(curve)[b - 1]) / (np.asarray(costs.estimate(b + 1)) + draft_seconds(draft_s, b))


def best_budget(costs: PassCosts, draft_s, curve: np.ndarray, ratio: float, k_max: int,
                margin: float = 1.03, speculative_only: bool = False, budgets: np.ndarray | None = None) -> int:
    """The budget in 0..``k_max`` with the highest predicted tokens per second.

    Args:
        costs: measured pass costs (must hold at least one record).
        draft_s: seconds of drafting per speculative step, or a function of the budgets (``draft_seconds``).
        curve: ``gain_curve`` ``[≥ k_max]``. ratio: calibration r.
        margin: speculation must beat plain decoding by this factor (noise guard).
        speculative_only: best B ≥ 1 even when plain decoding would win (probes).
        budgets: the budgets B ≥ 1 to choose from (int ``[m]``, each ≤ ``k_max``); None = 1..``k_max``.
    Returns:
        0 for plain decoding, else B.
    """
    if k_max < 1:
        return 0
    b = np.arange(1, k_max + 1) if budgets is None else np.asarray(budgets, dtype=np.int64)
    if len(b) == 0:
        return 0
    rate = predicted_rate(costs, draft_s, curve, ratio, b)
    i = int(np.argmax(rate))
    if speculative_only:
        return int(b[i])
    return int(b[i]) if rate[i] > margin / costs.estimate(1) else 0


class GainModel:
    """The running gain curve and its calibration, from the speculative steps' curves and acceptance.

    Attributes:
        curve: running gain curve (None before the first speculative step): a blend of the steps'
            curves, weight ``alpha`` (a probe's at least ``curve_probe``).
        best_curve: elementwise maximum of the gain curves seen (the futility bound).
        depth: positions of ``curve`` measured (beyond: a probe's extrapolation).
        accepted / predicted: running means of accepted and predicted drafted tokens per speculative
            step, from a prior of one each worth ``prior_steps`` steps (the calibration ``ratio``).
        n_spec: speculative steps observed.
    """

    def __init__(self):
        self.curve: np.ndarray | None = None
        self.best_curve: np.ndarray | None = None
        self.depth: int | None = None
        self.accepted = 1.0
        self.predicted = 1.0
        self.n_spec = 0

    @property
    def ratio(self) -> float:
        """Calibration r = accepted / predicted, clamped to [0.02, 2]: running means that start from a
        prior of one token each, so that r starts at 1 and no single probe sends it to a bound."""
        if self.predicted <= 0:
            return 1.0
        return float(np.clip(self.accepted / self.predicted, 0.02, 2.0))

    def upto(self, k_max: int) -> np.ndarray:
        """The running curve for budgets 1..``k_max`` (extrapolated beyond its length)."""
        return extrapolate(self.curve[:k_max], k_max)

    def observe(self, curve: np.ndarray, budget: int, accepted: int, probe: bool, cfg: BudgetConfig) -> None:
        """A speculative step drafted ``curve`` (its gain curve) with ``budget`` drafted tokens, of which
        ``accepted`` were accepted; ``probe``: it weighs as a probe (``curve_probe``, ``alpha_probe``)."""
        self.n_spec += 1
        w = max(cfg.alpha, cfg.curve_probe) if probe else cfg.alpha
        self.curve = blend(self.curve, curve, w, self.depth if cfg.measured_depth else None)
        self.depth = len(curve) if w >= 1.0 or self.depth is None else max(self.depth, len(curve))
        n = max(len(curve), 0 if self.best_curve is None else len(self.best_curve))
        new = extend(np.asarray(curve, dtype=np.float64), n)
        self.best_curve = new if self.best_curve is None else np.maximum(extend(self.best_curve, n), new)
        pred = float(curve[budget - 1]) if budget >= 1 else 0.0
        a = max(cfg.alpha_accept, 1.0 / (self.n_spec + cfg.prior_steps))  # a mean from the prior, then running
        if probe and cfg.alpha_probe is not None:
            a = max(a, cfg.alpha_probe)
        self.accepted = (1 - a) * self.accepted + a * accepted
        self.predicted = (1 - a) * self.predicted + a * pred
