"""Fitting a training schedule into a wall-clock budget (``tfm-train fit --time-budget``).

The first steps of a session are slow (CUDA kernels and graphs warming up,
allocator growth): on an H200, steps 10..40 took 0.47 s where the steady
rate was about 0.31 s, and a schedule cut once from them ended at 9.5 of
14 minutes. So the step time is re-estimated as the fit runs: the mean over
the last ``WINDOW`` steps (never the first ``SKIP`` of the session,
checkpoint writes timed apart), and the number of steps is re-fitted at step
``FIRST`` of the session, then every ``EVERY`` steps, and at the last step
of the schedule (which may lengthen it again, up to the full schedule).
"""
from __future__ import annotations

import math
import time
from collections import deque

SKIP = 20      # first steps of a session left out of the step time (warm-up)
FIRST = 40     # step of the session at which the schedule is first fitted to the budget
EVERY = 50     # steps between later re-fits
WINDOW = 100   # the step time is the mean over at most this many recent steps
MARGIN = 0.03  # share of the budget kept free (besides twice the longest checkpoint write: final save, export)


class TimeBudget:
    """Keeps the number of steps of a fit within ``budget_s`` seconds after ``t0``.

    Usage: ``total = tb.step_start(step, total)`` before each step (``step``
    is the global step about to run), ``tb.saved(seconds)`` after each
    checkpoint write. Time is read from ``time.time()`` at each call.

    Args:
        budget_s: wall-clock seconds for the whole fit of this session.
        t0: ``time.time()`` at the start of the session.
        first_step: the global step the session starts at (0, or the resumed step).
        max_total: the full schedule (epochs or ``--max-steps``): never exceeded.
        save_every: checkpoint period in steps (their cost is spread over the steps).
    """

    def __init__(self, budget_s: float, t0: float, first_step: int, max_total: int, save_every: int):
        self.budget, self.t0, self.first = float(budget_s), float(t0), int(first_step)
        self.max_total, self.save_every = int(max_total), max(1, int(save_every))
        self.times: deque[float] = deque(maxlen=WINDOW)  # seconds per step, checkpoint writes excluded
        self.last: float | None = None  # time of the previous step start
        self.pause = 0.0  # checkpoint-write seconds since the previous step start
        self.save_s = 0.0  # longest checkpoint write of this session
        self.next_fit = self.first + FIRST

    def saved(self, seconds: float) -> None:
        """Record a checkpoint write of ``seconds`` (excluded from the step time, counted apart)."""
        self.pause += seconds
        self.save_s = max(self.save_s, seconds)

    def step_time(self) -> float | None:
        """Mean seconds per step over the recent window, or None before any step was measured."""
        return sum(self.times) / len(self.times) if self.times else None

    def step_start(self, step: int, total: int) -> int:
        """Record the start of ``step``; returns the (possibly re-fitted) total number of steps.

        The total is re-fitted at the scheduled points and whenever ``step`` is
        the last one of the current schedule; it is never below ``step + 1``
        nor above ``max_total``.
        """
        now = time.time()
        if self.last is not None and step - self.first > SKIP:  # the step that just ended is past the warm-up
            self.times.append(max(0.0, now - self.last - self.pause))
        self.last, self.pause = now, 0.0
        if not self.times or step - self.first < FIRST or (step < self.next_fit and step + 1 < total):
            return total
        if step >= self.next_fit:
            self.next_fit = step + EVERY
        return self.fitted_total(step, now)

    def fitted_total(self, step: int, now: float) -> int:
        """Steps in all so that the fit, from ``step`` at ``now``, ends inside the budget minus the margin.

        The steps left ``n`` satisfy ``n · (dt + save_s / save_every) ≤ left``
        with ``left`` = (1 - MARGIN) · budget - elapsed - 2 · save_s.
        """
        dt = self.step_time() + self.save_s / self.save_every
        left = (1.0 - MARGIN) * self.budget - (now - self.t0) - 2.0 * self.save_s
        n = math.floor(left / dt) if left > 0 and dt > 0 else (0 if left <= 0 else self.max_total)
        return max(step + 1, min(self.max_total, step + n))
