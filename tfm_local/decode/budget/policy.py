"""The automatic budget's policy: per step, plain decoding or B drafted tokens (``plan`` → ``StepPlan``),
learning from each step's record (``observe``).

Speculation pays only when the tokens a step emits outweigh what the step costs (gain.py's rate).
Between probes only the one-token cost changes, so a "plain" choice is kept for ``recheck`` steps
rather than computed on each. The choice never changes the output: every step is verified losslessly.

**Capture.** A plain stretch costs what plain decoding costs: the target captures no layer inputs for
the drafter (``capture`` False: no features copy, no deferred row). The drafter then misses those
tokens, so capture turns back on ``window`` plain steps before the next speculative step is due (a
probe, or a decision that speculation pays): their rows are deferred and go in with one batched
injection at the draft, and the skipped tokens before them are a hole the drafter closes up (draft.py).
A stretch shorter than the window keeps the capture on. A generation's prompt is captured only when a
speculative step can fall within it (``capture_prompt``); the engine runs the plain steps that certainly
follow a decision (``stretch``) as plain decoding's own steps and reports them together.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import CPU, BudgetConfig
from .costs import DraftCosts, PassCosts, SteadyRuns, running_cost
from .gain import GainModel, best_budget, predicted_rate
from .probes import ProbeSchedule

#: ``BudgetPolicy._covered`` when the drafter holds the features of every committed token.
SYNCED = 1 << 30


@dataclass(frozen=True)
class StepPlan:
    """What one step does, as the budget planned it.

    budget: drafted nodes (0: a plain step). capture: the target captures the drafter's features (always
    for a speculative step). probe: the step is the automatic budget's probe. depth: nodes the tree is
    built to before it is cut to ``budget`` (its gain curve's length). curve: measure the gain curve.
    """

    budget: int
    capture: bool = True
    probe: bool = False
    depth: int = 0
    curve: bool = False

    @classmethod
    def fixed(cls, k_max: int) -> "StepPlan":
        """A fixed budget's step: ``k_max`` drafted nodes, features captured, no gain curve."""
        return cls(budget=k_max, depth=k_max)


class BudgetPolicy:
    """Per-step budget chooser (state kept across generations of one Engine).

    Args:
        config: the tuning (``config.CPU`` or ``config.GPU``, or either with fields replaced).
        costs: the target's pass costs (the engine shares one among its draft shapes' policies).
    Attributes:
        costs / gain / probes: pass costs, the gain curve and calibration, the probe schedule.
        draft_s: seconds of drafting per speculative step (running mean; None before the first).
        draft_costs: the same by the depth drafted (``DraftCosts``), what prices a budget's drafting when
            ``config.draft_ahead`` is set (``drafting``).
        probing: the last ``choose`` returned a probe (the step then drafts only ``B`` deep).
        capture: whether the step of the last ``choose`` has the target capture the drafter's features.
    """

    def __init__(self, config: BudgetConfig = CPU, costs: PassCosts | None = None):
        self.config = config
        self.costs = costs if costs is not None else PassCosts()
        self.gain = GainModel()
        self.probes = ProbeSchedule(config)
        self._draft_s: float | None = None
        self.draft_costs = DraftCosts()
        self.probing = False
        self.capture = True
        self._plain_kept = 0
        self._covered = SYNCED  # trailing committed tokens whose features the drafter has (or will have)
        self._spec = False      # the last choice was a speculative budget (not a probe)
        self._warming = False   # capturing ahead of a speculative step that found the drafter behind
        self._fresh = False     # no speculative step yet in this generation (its first one weighs as a probe's)
        self._probe_planned = False  # ``capture_prompt`` captures the prompt for a probe due within the generation
        self._last_b = 0        # the budget of the last choice (0: plain)
        self._runs = SteadyRuns()

    @property
    def draft_s(self) -> float | None:
        """Seconds of drafting per speculative step, at any depth (running mean; None before the first)."""
        return self._draft_s

    @draft_s.setter
    def draft_s(self, seconds: float | None) -> None:
        """State one drafting cost for every depth (a study's or a test's): the depths measured are
        forgotten, so ``drafting`` prices every budget at ``seconds`` until a step measures one again."""
        self._draft_s = seconds
        self.draft_costs = DraftCosts()

    @property
    def ratio(self) -> float:
        """The calibration r (``GainModel.ratio``)."""
        return self.gain.ratio

    @property
    def speculating(self) -> bool:
        """Whether the policy speculates (read-only): its last decision was a speculative budget, not a probe,
        and no "plain wins" decision came since (the plain steps that warm the drafter up for it keep it)."""
        return self._spec

    def budgets(self, k_max: int):
        """The budgets a speculative step may take up to ``k_max`` (``BudgetConfig.budgets``)."""
        return self.config.budgets(k_max)

    # -- a generation ----------------------------------------------------------------------
    def start(self, max_tokens: int, k_max: int) -> bool:
        """A generation of ``max_tokens`` tokens with budgets up to ``k_max`` starts: whether its prefill
        captures the prompt's features (``capture_prompt``, then ``begin``)."""
        captured = self.capture_prompt(max_tokens, k_max)
        self.begin(captured)
        return captured

    def capture_prompt(self, max_tokens: int, k_max: int) -> bool:
        """Whether the prefill of a generation of ``max_tokens`` tokens (the prefill's included) with
        budgets up to ``k_max`` captures the prompt's features for the drafter: when speculation pays
        now, or the next probe falls within the generation (the probe then drafts with the whole prompt
        in the drafter's cache; with ``probe_at_start`` it comes at the first step). Otherwise nothing is
        captured until a probe comes near. The prompt's rows go into the drafter at the prefill (queued
        for the probe instead, their injection would stall the stream mid-generation)."""
        cfg, k_max = self.config, min(k_max, max_tokens - 1)
        self._probe_planned = False
        if self._spec or self.gain.curve is None or self.draft_s is None or not self.costs.known(1):
            return True
        if k_max >= 1 and best_budget(self.costs, self.drafting(k_max), self.gain.upto(k_max), self.ratio, k_max,
                                      margin=cfg.margin, budgets=cfg.budgets(k_max)) > 0:
            return True
        if self.probes.every - self.probes.since > max_tokens - 3:  # as its first ``choose`` will count
            return False
        self._probe_planned = not self.futile(k_max)
        return self._probe_planned

    def begin(self, captured: bool) -> None:
        """A generation starts; ``captured``: the drafter got every prompt token's features. Its first
        step decides afresh (a kept "plain wins" is dropped: ``capture_prompt`` may have found that
        drafting pays); with ``probe_at_start`` and the prompt captured, a probe due within the generation
        is due now."""
        pr = self.probes
        self.capture = captured
        self._plain_kept = 0
        self._warming = False
        self._covered = SYNCED if captured else 0
        self._fresh = True
        if captured and self.config.probe_at_start and self._probe_planned:  # the planned probe now; the
            pr.pulled = max(pr.every - pr.since, 0)  # steps it came early go to the next gap
            pr.since = max(pr.since, pr.every)
        self._probe_planned = False

    # -- a step ----------------------------------------------------------------------------
    def plan(self, k_max: int, remaining: int | None = None) -> StepPlan:
        """The next step's plan (``choose``): a probe drafts only its budget deep, any other step's
        gain curve is measured to ``k_max``."""
        b = self.choose(k_max, remaining)
        return StepPlan(budget=b, capture=self.capture, probe=self.probing,
                        depth=b if self.probing else int(self.depth(b, k_max)), curve=True)

    def depth(self, b, k_max: int):
        """Nodes a speculative (not probing) step with budget ``b`` (int or array) drafts: ``b`` plus
        ``config.draft_ahead``, at most ``k_max``; ``k_max`` when ``draft_ahead`` is None."""
        ahead = self.config.draft_ahead
        return k_max if ahead is None else np.minimum(np.asarray(b) + ahead, k_max)

    def drafting(self, k_max: int, probe: bool = False):
        """The drafting cost ``best_budget`` and the probe rules price a budget with (``gain.draft_seconds``):
        ``draft_s``, or, with ``config.draft_ahead`` and a depth measured twice, a function of the budgets:
        ``draft_costs`` at each budget's ``depth`` (``probe``: at the budget itself, a probe's depth).
        A depth measured once may hold a cold pass (the first of its shapes allocates): priced by it,
        every budget could stay priced out and never measured again, so until then ``draft_s`` (whose
        running mean replaces its first sample) prices them all."""
        if self.config.draft_ahead is None or not self.draft_costs.largest(warm=True):
            return self.draft_s
        if probe:
            return lambda b: self.draft_costs.estimate(b)
        return lambda b: self.draft_costs.estimate(self.depth(b, k_max))

    def choose(self, k_max: int, remaining: int | None = None) -> int:
        """Budget for the next step, at most ``k_max`` (0 = plain decoding); sets ``probing`` and ``capture``.

        ``remaining``: tokens the generation still wants (this step's included), None = unbounded: a
        plain stretch warms the drafter up only for a speculative step that can still come.
        """
        cfg, pr = self.config, self.probes
        self.probing = False
        if k_max < 1 or not self.costs.known(1):
            return self._plain(self.capture)  # the first step measures a plain pass; no switch at the end
        if self.gain.curve is None or self.draft_s is None:
            return self._speculate(cfg.fit(min(cfg.first_probe, k_max), k_max), probe=True, every=pr.every)
        if self._warming and self._covered < cfg.window:  # a warm-up, once begun, runs its course:
            return self._plain(True)                      # a decision near the margin would flip it
        self._warming = False
        b = self._decide(k_max)
        if b > 0:
            return self._speculate(b, probe=False, every=cfg.probe_min)
        if self._spec:  # speculation just stopped paying (a few unlucky steps can do it): re-probe soon,
            pr.since = 0  # not after the cost-spaced gap, if the run saved time (``probes.run``)
            if pr.run > 0:
                pr.every = cfg.probe_min
            pr.run = 0.0
        self._spec = False
        pr.since += 1
        due = pr.every + 1 - pr.since  # steps until the probe (0: this one)
        if due <= cfg.window and not pr.gated:  # before its warm-up begins: can the probe matter?
            pr.gated = True
            if self.futile(k_max):
                pr.since, pr.gated = 0, False
                pr.every = min(2 * pr.every, cfg.probe_cap)
                return self._plain(False)
        if due > 0:
            return self._plain(due <= cfg.window and (remaining is None or due <= remaining - 2))
        return self._probe(k_max)

    def _probe(self, k_max: int) -> int:
        """The due probe: the best speculative budget, or an exploration of a larger pass, or a cold
        size measured again."""
        cfg, pr = self.config, self.probes
        allowed = cfg.budgets(k_max)
        b = best_budget(self.costs, self.drafting(k_max), self.gain.upto(k_max), self.ratio, k_max, speculative_only=True,
                        budgets=allowed)
        x = self.exploration(k_max)
        cold = [n for n in self.costs.cold() if n - 1 <= k_max and n - 1 in allowed]
        if cold:  # a size's first pass was cold (a GPU loads its kernels): measure the largest such size
            b, x = cold[0] - 1, 0                # again before it prices anything (``PassCosts.cold``)
        b = self._speculate(max(b, x), probe=True, every=2 * pr.every)
        if b and b == x:
            pr.explored, pr.explored_from = x + 1, self.costs.largest(warm=True)
        return b

    def futile(self, k_max: int) -> bool:
        """Whether a probe now could not lead to speculation (``ProbeSchedule.futile``)."""
        return self.probes.futile(k_max, self.config, self.costs, self.gain, self.drafting(k_max))

    def exploration(self, k_max: int) -> int:
        """The budget a due probe explores at, 0 for none (``ProbeSchedule.exploration``)."""
        return self.probes.exploration(k_max, self.config, self.costs, self.gain, self.drafting(k_max))

    def _plain(self, capture: bool) -> int:
        self._last_b = 0
        self.capture = capture
        self._covered = min(self._covered + 1, SYNCED) if capture else 0
        return 0

    def _speculate(self, b: int, probe: bool, every: int) -> int:
        """``b`` drafted tokens, once the drafter has the recent tokens' features (else a plain step
        that captures them: the choice is made again at the next step); ``every``: the next probe's
        gap before its floor (``ProbeSchedule.spacing``)."""
        pr = self.probes
        if self._covered < self.config.window:
            self._warming = True
            return self._plain(True)
        pr.since, pr.gated = -pr.pulled if probe else 0, False
        pr.pulled = 0
        pr.every = pr.spacing(every, self.config, self.costs)
        self.probing, self.capture, self._spec = probe, True, not probe
        self._covered = SYNCED
        self._last_b = b
        return b

    def _decide(self, k_max: int) -> int:
        """``best_budget`` now, or 0 while an earlier "plain wins" is kept (``recheck``)."""
        cfg = self.config
        if self._plain_kept > 0:
            self._plain_kept -= 1
            return 0
        margin = cfg.keep if self._spec else cfg.margin
        allowed = cfg.budgets(k_max)
        curve = self.gain.upto(k_max)
        b = best_budget(self.costs, self.drafting(k_max), curve, self.ratio, k_max, margin=margin, budgets=allowed)
        self._plain_kept = cfg.recheck - 1 if b == 0 else 0
        last = self._last_b
        if b and self._spec and last and last != b and last in allowed and cfg.size_keep < 1.0:
            r_last, r_best = predicted_rate(self.costs, self.drafting(k_max), curve, self.ratio, [last, b])
            if r_last >= cfg.size_keep * r_best and r_last > margin / self.costs.estimate(1):
                b = last
        return b

    def stretch(self) -> int:
        """Plain steps without capture that certainly follow the last ``choose`` (0 or more): while a
        "plain wins" decision is kept (``recheck``) and the next probe's warm-up is further away, every
        choice would be plain decoding without capture, whatever the plain steps measure. The engine runs
        them as plain decoding's own steps (no drafter, no per-step budget work) and reports them
        together with ``observe_stretch``. Valid after ``observe`` of the step that ``choose`` decided."""
        if self.probing or self._spec or self.capture or self._warming or self.gain.curve is None:
            return 0
        pr = self.probes
        return max(min(self._plain_kept, pr.every - pr.since - self.config.window), 0)

    # -- learning --------------------------------------------------------------------------
    def observe(self, rec) -> int:
        """Learn from one decode step (a ``step.StepRecord``): a plain step's pass cost, or a speculative
        step's pass cost, drafting time, gain curve and acceptance; and what the probe cycle costs.
        Returns the plain steps that now certainly follow (``stretch``)."""
        steady = self._passed(rec.n_nodes, 1)
        if rec.speculative:
            self.observe_spec(rec.n_nodes, rec.t_verify, rec.t_draft - rec.t_sync, rec.curve, rec.budget,
                              rec.n_accepted, record=steady, probe=rec.probe or self._fresh,
                              depth=len(rec.curve) if rec.curve is not None else rec.budget)
            self._fresh = False
        elif not rec.switched and steady:  # a switch may re-plan the graph (the first capture): no pass cost
            self.observe_plain(rec.t_verify)
        self.probes.account(rec, self.config, self.costs, self.drafting(rec.budget, probe=True))
        return self.stretch()

    def observe_stretch(self, n: int, verify_s: float, step_s: float) -> None:
        """``n`` plain steps without capture ran (a ``stretch``, or its first ``n`` steps when the
        generation ended): ``verify_s`` / ``step_s`` the seconds of their target passes (``StepRecord.
        t_verify``) and of their whole records (``t_step``), summed. The state moves as ``n`` calls of
        ``choose`` and ``observe`` would have moved it; the costs take the stretch's mean pass as one
        sample."""
        if n < 1:
            return
        pr = self.probes
        pr.since += n
        self._plain_kept = max(self._plain_kept - n, 0)
        self._covered = 0
        if self._passed(1, n):
            self.observe_plain(verify_s / n)
        pr.plain_s = running_cost(pr.plain_s, step_s / n, self.config.alpha, False)

    def observe_prompt(self, seconds: float) -> None:
        """The prefill captured the prompt's features for the drafter: ``seconds`` of reading them and
        of the drafter's injection pass over the prompt (the engine's timing; the target's own share of
        the capture is not in it). The generation's first step decides where it goes
        (``ProbeSchedule.account``): a probe's cycle when that step is a probe or a plain step, what
        speculation saved when it is a speculative one."""
        if seconds > 0:
            self.probes.prompt_s += seconds

    def _passed(self, n_nodes: int, count: int) -> bool:
        """``count`` target passes of ``n_nodes`` ran; whether the last one's cost is to be recorded
        (``steady_costs``: the third pass in a row of its size or later)."""
        run = self._runs.passed(n_nodes, count)
        return not self.config.steady_costs or run >= 3

    def observe_plain(self, seconds: float) -> None:
        """A plain step's target pass (1 token) took ``seconds``."""
        self.costs.record(1, seconds)

    def observe_spec(self, n_nodes: int, verify_s: float, draft_s: float, curve,
                     budget: int, accepted: int, record: bool = True, probe: bool = False,
                     depth: int | None = None) -> None:
        """A speculative step: ``n_nodes`` verified in ``verify_s``, drafting ``depth`` nodes deep (None:
        ``budget``) took ``draft_s``, ``curve`` its gain curve, ``budget`` drafted tokens of which
        ``accepted`` were accepted; ``record``: the pass's cost enters ``costs``; ``probe``: it weighs as
        a probe."""
        self._plain_kept = 0
        if record:
            self.costs.record(n_nodes, verify_s)
        self._draft_s = running_cost(self._draft_s, draft_s, self.config.alpha, self.gain.n_spec == 1)
        self.draft_costs.record(budget if depth is None else depth, draft_s)
        self.gain.observe(curve, budget, accepted, probe, self.config)
