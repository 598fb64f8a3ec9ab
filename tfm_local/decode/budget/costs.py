"""Measured costs: running means that forget a cold first sample, the target's pass costs by size and
the drafter's step costs by draft depth.

``c(n)``, the seconds of one target pass over n tokens, is measured on this machine as the engine runs
(``PassCosts``): a running mean per n, piecewise-linear in between, extended with the slope of the last
segment. On a CPU it grows almost linearly with n; on a GPU it is nearly flat up to ~64 nodes.
"""
from __future__ import annotations

import numpy as np

#: A new sample of a running cost counts at most this many times the current mean (an outlier: a
#: collection pause, a re-reserve, a first launch of a new shape).
OUTLIER = 2.0

#: The same for a probe cycle's cost, whose samples vary more (a cycle that accepted its drafts costs
#: little, one with capture switches and a deferred injection tens of plain steps).
PROBE_OUTLIER = 10.0


def running_cost(mean: float | None, sample: float, alpha: float, warm: bool, cap: float = OUTLIER) -> float:
    """The next value of a running mean of costs (seconds) after ``sample``.

    ``warm``: the mean so far holds only the first sample, which carries one-time costs (on a GPU the
    first pass of a shape captures its CUDA graph and allocates): the second sample replaces it (not the
    lower of the two: that would bias the costs low). Later samples enter an exponential moving average
    (weight ``alpha``), each capped at ``cap`` times the mean, so that a single slow step cannot price
    speculation out for hundreds of steps while a real change (a slower machine, a longer context)
    still comes through within a few. A mean of 0 takes the next sample.
    """
    if mean is None or warm or mean <= 0.0:  # a mean of 0 (a probe cycle that cost nothing) would cap
        return sample                         # every later sample to 0
    return (1 - alpha) * mean + alpha * min(sample, cap * mean)


class PassCosts:
    """Measured seconds of one target pass by its token count n.

    ``record(n, s)`` keeps a running mean per n (``running_cost``: the second sample replaces the
    first, then an exponential moving average of weight ``alpha`` with outliers capped);
    ``estimate(n)`` takes the running maximum of those means over increasing n (costs never fall with
    n), interpolates linearly between measured n, extends past the largest with the slope of the last
    segment (never below the last value) and below the smallest with the smallest's value. Units:
    seconds.

    A size measured once is **cold** (``cold``): on a GPU the first pass of a new shape loads its
    kernels and captures its graph. Once some size above one token is warm (measured twice),
    ``estimate`` leaves cold sizes out: one cold sample would otherwise price its size, and through the
    running maximum every larger one, out of the budget for good, and so never be measured again.
    """

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self._mean: dict[int, float] = {}
        self._count: dict[int, int] = {}

    def record(self, n: int, seconds: float) -> None:
        """Add one measured pass of ``n`` tokens (n ≥ 1) that took ``seconds``."""
        if n < 1 or not seconds > 0:
            return
        count = self._count.get(n, 0)
        self._mean[n] = running_cost(self._mean.get(n), seconds, self.alpha, count == 1)
        self._count[n] = count + 1

    def known(self, n: int) -> bool:
        """Whether a pass of exactly ``n`` tokens was measured."""
        return n in self._mean

    def samples(self, n: int) -> int:
        """How many passes of exactly ``n`` tokens were measured."""
        return self._count.get(n, 0)

    def largest(self, warm: bool = False) -> int:
        """The largest pass size measured (``warm``: measured at least twice); 0 when there is none."""
        return max((n for n in self._mean if not warm or self._count[n] >= 2), default=0)

    def cold(self) -> list[int]:
        """Sizes above one token measured exactly once, largest first."""
        return sorted((n for n, c in self._count.items() if c == 1 and n > 1), reverse=True)

    def estimate(self, n: int | np.ndarray) -> float | np.ndarray | None:
        """Estimated seconds of a pass over ``n`` tokens (scalar or array); None before any record."""
        if not self._mean:
            return None
        used = self._mean.keys()
        if self.largest(warm=True) > 1:  # cold sizes out (the class's note); plain passes stay in
            used = [m for m in used if self._count[m] >= 2 or m == 1]
        xs = np.array(sorted(used), dtype=np.float64)
        # a pass over more tokens never costs less: a size measured cheaper than a smaller one (a few
        # noisy samples) would otherwise be the budget chosen, and the bet lose
        ys = np.maximum.accumulate(np.array([self._mean[int(x)] for x in xs]))
        q = np.asarray(n, dtype=np.float64)
        out = np.interp(q, xs, ys)
        if len(xs) >= 2:
            slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
            out = np.where(q > xs[-1], ys[-1] + slope * (q - xs[-1]), out)
        return float(out) if np.ndim(out) == 0 else out


class DraftCosts(PassCosts):
    """Measured seconds of the drafter's part of a speculative step by the depth it drafted (the block rows
    after the root, which is the tree's planned node count ``StepPlan.depth`` for every method: a tree of
    d nodes is at most d deep).

    As ``PassCosts`` (``record(d, s)``, ``estimate(d)``), except below the smallest depth measured: a
    drafter pass there is priced as half a fixed cost and half rows, ``s_min · (1 + (d + 1) / (d_min + 1))
    / 2``, not as the smallest depth's whole cost. On a CPU the drafter's pass costs grow with its rows
    (block and head rows), and pricing a shallower draft as dear as the first one measured would keep
    the budget from ever trying, and so measuring, the shallow drafts that pay; the first shallow step
    replaces the prior with its measurement.
    """

    def estimate(self, n: int | np.ndarray) -> float | np.ndarray | None:
        """Estimated seconds of drafting ``n`` deep (scalar or array); None before any record."""
        out = super().estimate(n)
        if out is None:
            return None
        d0 = min(self._mean)
        q = np.asarray(n, dtype=np.float64)
        below = self._mean[d0] * (1.0 + (q + 1.0) / (d0 + 1.0)) / 2.0
        out = np.where(q < d0, below, out)
        return float(out) if np.ndim(out) == 0 else out


class SteadyRuns:
    """Which passes are steady: the target's last pass size and how many passes in a row had it.

    On a GPU the first pass of a shape after another runs kernel by kernel and the second captures its
    CUDA graph; ggml-cuda replays from the third (``BudgetConfig.steady_costs``)."""

    def __init__(self):
        self.n = 0
        self.length = 0

    def passed(self, n_nodes: int, count: int) -> int:
        """``count`` passes of ``n_nodes`` ran; how many passes in a row had that size since."""
        self.length = self.length + count if n_nodes == self.n else count
        self.n = n_nodes
        return self.length
