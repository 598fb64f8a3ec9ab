"""Probe scheduling: when plain decoding wins, when to try the drafter again, and what trying costs.

While plain decoding wins the drafter is still probed now and then (after 8, 16, 32 … 256 plain steps,
``BudgetConfig.probe_min`` .. ``probe_max``) so that the statistics follow the text. The probes are
spaced by their measured cost: the time a probe cycle (its warm-up steps or its captured prompt, the
capture switches and the probe itself) takes beyond plain steps emitting the same tokens
(``probe_cost``) sets a floor on the plain steps between two probes, ``probe_cost / (overhead · c(1))``,
so that probing costs at most ``overhead`` of plain decoding while speculation keeps losing; what
speculation saved since the last probe (``probe_gain``) is subtracted from that cost, so where probing
pays the probes follow the doubling schedule; the gap stops growing at ``probe_cap``. The first cycle
of a process is a warm-up (a drafter's first pass, new shapes) and does not space the probes.

A probe that is due **explores** (``exploration``) when speculation would pay were the passes beyond
the largest measured size no dearer than it: it verifies twice as many nodes as the largest measured
pass; when that pass costs less than 1.5x the previous largest, the next probe comes after
``probe_min`` steps, so a GPU (costs nearly flat in n) reaches its real budget within a few probes,
while on a CPU (costs linear in n) exploration stops after one or two. A probe that could not lead to
speculation even at the best curve seen is skipped (``futile``).
"""
from __future__ import annotations

import numpy as np

from .config import BudgetConfig
from .costs import PROBE_OUTLIER, PassCosts, running_cost
from .gain import GainModel, draft_seconds, extrapolate


class ProbeSchedule:
    """The probes' spacing and the account of the probe cycle under way (seconds; counts in steps).

    Attributes:
        since: plain steps since the last probe (or speculative step); every: the gap before the next.
        pulled: steps a probe came early at a generation's start (added to the next gap).
        gated: the probe due has been checked for futility.
        explored / explored_from: the pass size the probe under way explores (0: none), and the largest
            warm size before it.
        n_cycles: probe cycles closed (the first one's cost is a warm-up).
        probe_cost: seconds a probe cycle takes beyond plain decoding of the same tokens (running mean;
            None before the first probe's record).
        probe_gain: seconds speculation saved between two probes, running mean over cycles from 0, each
            sample between 0 and ``PROBE_OUTLIER`` cycles' cost.
        plain_s: seconds of a plain step without capture or switch, its whole record (running mean; the
            baseline of ``probe_cost``).
        cycle: extra seconds of the cycle under way; prompt_s: a captured prompt's seconds, until the
            generation's first step; earned: seconds speculative steps saved since the last probe.
        run: seconds the speculation under way saved so far (< 0: lost); a run that stopped having lost
            keeps the probe schedule.
    """

    def __init__(self, cfg: BudgetConfig):
        self.since = 0
        self.every = cfg.probe_min
        self.pulled = 0
        self.gated = False
        self.explored = 0
        self.explored_from = 0
        self.n_cycles = 0
        self.probe_cost: float | None = None
        self.probe_gain = 0.0
        self.plain_s: float | None = None
        self.cycle = 0.0
        self.prompt_s = 0.0
        self.earned = 0.0
        self.run = 0.0

    def spacing(self, doubled: int, cfg: BudgetConfig, costs: PassCosts) -> int:
        """Plain steps before the next probe: the doubling schedule (``probe_min`` .. ``probe_max``), at
        least what keeps probing within ``overhead`` of plain time, the cycle's cost net of what
        speculation saved since the last probe (``probe_gain``), at most ``probe_cap``."""
        n = min(max(doubled, cfg.probe_min), cfg.probe_max)
        c1 = self.plain_s if self.plain_s is not None else costs.estimate(1)
        if self.probe_cost is not None and c1 and self.n_cycles >= 2:  # the first cycle is a warm-up
            net = self.probe_cost - self.probe_gain
            n = max(n, int(np.ceil(net / (cfg.overhead * c1))))
        return min(n, cfg.probe_cap)

    def futile(self, k_max: int, cfg: BudgetConfig, costs: PassCosts, gain: GainModel,
               draft_s: float | None) -> bool:
        """Whether a probe now could not lead to speculation: no budget up to ``k_max`` beats plain
        decoding by the margin even with the best gain curve seen so far (times the calibration r where
        it is above 1) and passes beyond the largest warm size no dearer than that size. Such a probe is
        skipped and the gap doubles, up to ``probe_cap``, where the drafter is probed whatever the bound
        says (the text may have changed)."""
        if (not cfg.skip_futile or gain.best_curve is None or draft_s is None
                or self.n_cycles < cfg.futile_after or self.every >= cfg.probe_cap or k_max < 1):
            return False
        n_warm = max(costs.largest(warm=True), 1)
        b = cfg.budgets(k_max)
        c = np.asarray(costs.estimate(np.minimum(b + 1, n_warm)))
        g = max(gain.ratio, 1.0) * extrapolate(gain.best_curve[:k_max], k_max)[b - 1]
        return float(np.max((1.0 + g) / (c + draft_seconds(draft_s, b)))) <= cfg.margin / costs.estimate(1)

    @staticmethod
    def exploration(k_max: int, cfg: BudgetConfig, costs: PassCosts, gain: GainModel, draft_s) -> int:
        """The budget a due probe explores at (0: none): twice the nodes of the largest pass measured
        (at most ``k_max`` + 1), when speculation at ``k_max`` would beat plain decoding by the margin if
        passes beyond that largest size cost no more than it (the gain from the extrapolated curve)."""
        n_max = costs.largest(warm=True)
        if n_max < 2 or n_max > k_max:
            return 0
        g = 1.0 + gain.ratio * float(gain.upto(k_max)[k_max - 1])
        x = cfg.fit(min(2 * n_max, k_max + 1) - 1, k_max)
        flat = costs.estimate(n_max) + float(draft_seconds(draft_s, k_max))
        return x if x > n_max - 1 and g / flat > cfg.margin / costs.estimate(1) else 0

    def account(self, rec, cfg: BudgetConfig, costs: PassCosts, draft_s: float | None) -> None:
        """Add a step's time beyond plain decoding of its tokens to the probe cycle under way: every step
        but a plain one without capture or switch; a probe closes the cycle (``probe_cost``)."""
        a = cfg.alpha
        prompt, self.prompt_s = self.prompt_s, 0.0  # a captured prompt's cost goes with this step's kind:
        self.cycle += prompt                         # the probe cycle, or (below) what speculation saved
        if not (rec.speculative or rec.capture or rec.switched):
            self.plain_s = running_cost(self.plain_s, rec.t_step, a, False)
            return
        c1 = self.plain_s if self.plain_s is not None else costs.estimate(1)
        if c1 is None:
            return
        if rec.speculative and not rec.probe:  # speculation pays: no probe cycle
            self.cycle = 0.0
            self.earned += c1 * len(rec.tokens) - rec.t_step - prompt
            self.run += c1 * len(rec.tokens) - rec.t_step
            return
        self.cycle += rec.t_step - c1 * len(rec.tokens)
        if rec.probe:
            self._close(rec, cfg, costs, draft_s, c1)

    def _close(self, rec, cfg: BudgetConfig, costs: PassCosts, draft_s: float | None, c1: float) -> None:
        """A probe closes the cycle: its cost, what speculation saved since the last one, the next gap."""
        a = cfg.alpha
        # at least what the probe step itself cost beyond plain steps of its tokens, from the running
        # costs (the cycle's sum over tens of steps carries their noise), with this probe's injection of
        # the deferred rows (``t_sync``, left out of the drafting time)
        d = float(draft_seconds(draft_s, max(rec.budget, 1))) if draft_s is not None else 0.0
        own = float(costs.estimate(rec.n_nodes)) + d + rec.t_sync - c1 * len(rec.tokens)
        self.probe_cost = running_cost(self.probe_cost, max(self.cycle, own, 0.0), a, self.n_cycles == 1,
                                       cap=PROBE_OUTLIER)
        # what the speculation since the last probe saved, at most PROBE_OUTLIER cycles' cost (a long
        # winning run would lift the floor for many probes) and no less than nothing (a losing run,
        # e.g. carried over into another text, would push the probes out to ``probe_cap``)
        g = cfg.alpha_probe if cfg.alpha_probe is not None else a
        earned = min(max(self.earned, 0.0), PROBE_OUTLIER * (self.probe_cost or 0.0))
        self.probe_gain = (1 - g) * self.probe_gain + g * earned
        self.n_cycles += 1
        self.cycle = self.earned = 0.0
        self.every = self.spacing(self.every, cfg, costs)
        if self.explored and costs.samples(self.explored) < 2:
            self.every = cfg.probe_min  # its first pass was cold: measure it again soon
        elif self.explored:  # a pass no dearer than 1.5x the previous largest: explore on soon
            grew = costs.estimate(self.explored) / costs.estimate(self.explored_from)
            if grew < 1.5:
                self.every = cfg.probe_min
            self.explored = self.explored_from = 0
