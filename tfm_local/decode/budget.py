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
  drafter is rarely calibrated; above temperature 0 acceptance also differs),
  from a prior of one token each, so that one missed probe does not send it to
  its floor.

Pass costs beyond the largest size measured are extrapolated with the slope of
the last measured segment, which a probe alone cannot correct: on the H200 a
1-token pass (a CUDA graph, no capture) takes 1.95 ms and a probe's 2-node pass
4.0 ms, so the slope prices a 17-node pass at ~35 ms where it takes 4.3. So a
probe that is due **explores** (``exploration``) when speculation would pay were
the passes beyond the largest measured size no dearer than it: it verifies
twice as many nodes as the largest measured pass (up to the budget's ceiling);
when that pass costs less than 1.5x the previous largest, the next probe comes
after ``probe_min`` steps instead of its cost-based gap, so a GPU reaches its
real budget within a few probes, while on a CPU (costs linear in n) it stops
after one or two.

A pass size measured once is cold and prices nothing while a warm size (two samples) exists: the
next due probe measures it again (``PassCosts.cold``; on the H200 an explored 16-node pass took 32 ms
the first time and 4.3 after, and that one sample kept the budget at 8 nodes, where speculation did
not pay, on a set where DDTree@16 ran at 1.25x plain).

The running costs (c, d, the probe cycle's) forget their first sample (on a
GPU the first pass of a shape captures its CUDA graph: 26 ms for a pass that
then takes 1.9) and cap later outliers at twice the mean (``running_cost``).

When plain decoding wins, the drafter is still probed now and then (after 8,
16, 32 … 256 plain steps, with the best speculative budget) so the statistics
follow the text; when speculation that saved time stops paying, the first probe comes after 8
steps whatever probes cost (a few unlucky steps can tip the running means); after a run that lost,
the probes keep their schedule. A probe drafts only as deep as its budget
(``probing``), so it costs one short drafter pass and one short verification; the gains of
deeper budgets are then extrapolated from it (``extrapolate``) until a step drafts deeper
(``measured_depth``). Between probes
only the one-token cost changes, so a "plain" choice is re-evaluated every
``recheck`` (32) steps rather than on each (~60 µs of NumPy per evaluation,
3% of a plain step on the H200 if done every step). The choice never changes
the output: every step is verified losslessly.

A plain stretch costs what plain decoding costs: the target captures no layer
inputs for the drafter (``capture`` False: no features copy, no deferred row).
The drafter then misses those tokens, so capture turns back on ``window``
plain steps before the next speculative step is due (a probe, or a decision
that speculation pays): their rows are deferred and go in with one batched
injection at the draft, and the skipped tokens before them are a hole the
drafter closes up (draft.py). A switch of the capture changes nothing in the
target's graph (patch 0013; it used to cost a scheduler re-reserve, ~10 ms on the
2-core CPU); a stretch shorter than the window keeps the capture on. A generation's
prompt is captured only when a speculative step can fall within it
(``plan``). The probes are spaced by their measured
cost: the time a probe cycle (its warm-up steps or its captured prompt, the capture switches and
the probe itself) takes beyond plain steps emitting the same tokens (``probe_cost``,
from the step records' phases and the engine's timing of a captured prompt, ``observe_prompt``) sets a floor on the plain steps between two
probes, ``probe_cost / (overhead · c(1))``, so that probing costs at most
``overhead`` (0.5%) of plain decoding while speculation keeps losing; what
speculation saved since the last probe (0 to 10 cycles' cost) is subtracted from that
cost (``probe_gain``), so where probing pays the probes follow the doubling schedule;
the gap still stops growing at ``probe_cap`` steps, so the drafter is re-probed
eventually. On a GPU a probe due within a generation comes at its first step, with the
prompt's features captured in the prefill instead of a warm-up, and the steps it came
early are added to the next gap (``probe_at_start``). The first cycle of a process is
a warm-up (the drafter's first pass, CUDA graphs of new shapes: 27.7 ms on the H200 against ~5 ms from its
parts) and does not space the probes; the second cycle's cost replaces it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


#: A new sample of a running cost counts at most this many times the current mean (an outlier: a
#: collection pause, a re-reserve, a first launch of a new shape).
OUTLIER = 2.0


#: The same for a probe cycle's cost, whose samples vary more (a cycle that accepted its drafts costs
#: little, one with capture switches and a deferred injection tens of plain steps): capped at twice
#: the mean, a cheap first cycle kept the running cost at 1.2-3 ms for the whole of a 10-prompt run on
#: the H200 (growing 1.2x a cycle) while the cycles cost ~15-25 ms, and the probes came 5x too often.
PROBE_OUTLIER = 10.0


def running_cost(mean: float | None, sample: float, alpha: float, warm: bool, cap: float = OUTLIER) -> float:
    """The next value of a running mean of costs (seconds) after ``sample``.

    ``warm``: the mean so far holds only the first sample, which carries one-time costs (on a GPU the
    first pass of a shape captures its CUDA graph and allocates: 26 ms for a 2-token pass that then
    takes 1.9 ms, a first drafter call of 19 ms against 2 ms; H200, 2026-12-02): the second sample
    replaces it (not the lower of the two: that would bias the costs low). Later samples enter an
    exponential moving average (weight ``alpha``), each capped at ``cap`` times the mean, so that
    a single slow step cannot price speculation out for hundreds of steps while a real change (a
    slower machine, a longer context) still comes through within a few.
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
    kernels and captures its graph (H200, 2026-12-03: a 16-node pass 32 ms the first time, 4.3 ms
    after). Once some size above one token is warm (measured twice), ``estimate`` leaves cold sizes
    out: one cold sample would otherwise price its size, and through the running maximum every larger
    one, out of the budget for good, and so never be measured again.
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
        # noisy samples) would otherwise be the budget chosen, and the bet lose (the 2-core CPU)
        ys = np.maximum.accumulate(np.array([self._mean[int(x)] for x in xs]))
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


def predicted_rate(costs: PassCosts, draft_s: float, curve: np.ndarray, ratio: float, b) -> np.ndarray:
    """Predicted tokens per second of budgets ``b`` (int, scalar or ``[m]`` ≥ 1): ``(1 + r·g(B)) /
    (c(B+1) + d)`` (docs/design.md §5)."""
    b = np.asarray(b, dtype=np.int64)
    return (1.0 + ratio * np.asarray(curve)[b - 1]) / (np.asarray(costs.estimate(b + 1)) + draft_s)


def best_budget(costs: PassCosts, draft_s: float, curve: np.ndarray, ratio: float, k_max: int,
                margin: float = 1.03, speculative_only: bool = False, budgets: np.ndarray | None = None) -> int:
    """The budget in 0..``k_max`` with the highest predicted tokens per second.

    Args:
        costs: measured pass costs (must hold at least one record).
        draft_s: seconds of drafting per speculative step.
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


#: The node counts of a verification pass under the automatic budget on a GPU (``AutoBudget.on_gpu``):
#: few shapes, each of which keeps its CUDA graph (patch 0014). With every size allowed the budget moved
#: by one node a step (16, 15, 14, … 5 on HumanEval, H200, 2026-12-03): every pass was of a new shape and
#: ran kernel by kernel (a speculative step 8.2 ms against DDTree@16's steady 6.6), each such cost priced
#: its size out, and the budget stopped speculating where DDTree@16 ran at 1.2x plain.
GPU_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)

#: ``AutoBudget._covered`` when the drafter holds the features of every committed token.
SYNCED = 1 << 30


@dataclass
class AutoBudget:
    """Per-step budget chooser (state kept across generations of one Engine).

    Args:
        first_probe: budget of the first speculative step, before any statistics (at most the
            ceiling). Deep enough that one probe measures a gain curve and a pass of a useful size: on
            a GPU a pass of 8 nodes costs what one of 2 does, and a curve extrapolated from one
            position (a probe at 1) told the budget little (2026-12-03, H200: 2-3 probes in 6,000
            HumanEval tokens, none of which led to speculation where DDTree@16 ran at 1.21x plain).
    Attributes:
        probing: the last ``choose`` returned a probe (the engine then drafts
            only ``B`` deep instead of computing the whole gain curve).
        capture: whether the step of the last ``choose`` has the target capture the drafter's
            features (always for a speculative step; for a plain one only within ``window`` steps of
            the next speculative step).
        probe_min / probe_max: plain steps between probes (doubling while plain keeps winning).
        recheck: plain steps a "plain wins" decision is kept before it is computed again (a
            speculative step's statistics clear it at once).
        window: plain steps whose features the drafter gets before a speculative step that follows a
            stretch without capture (the tokens before them are a hole in its cache).
        overhead: the most of plain decoding's time probing may cost (sets the probe spacing's floor).
        probe_cap: the most plain steps between two probes, whatever a probe costs.
        probe_cost: seconds a probe cycle takes beyond plain decoding of the same tokens (running
            mean; None before the first probe's record).
        plain_s: seconds of a plain step without capture or switch, its whole record (running mean;
            the baseline of ``probe_cost``).
        alpha: weight of a new sample in the running means of costs and the gain curve.
        alpha_accept: the same for the accepted and predicted tokens behind ``ratio``. A step's accepted
            count varies a lot (a chain of 15 at 85% a position: mean 5.2, deviation ~4), and at 0.2 the
            ratio's running value swung to 0.3 within tens of steps of a steady drafter, stopping
            speculation that paid 1.8x; at 0.05 its swings still ended speculation that paid 1.2x every
            ~200 steps, and probes 256 steps apart took ~1,000 steps to restart it (simulated,
            HumanEval-like drafter on H200 costs: 0.96x plain time where 0.81x was to be had; 0.88x at
            0.03 with ``keep``). At 0.03 it follows a change of text within ~35 steps. The first
            steps take the plain mean with the prior (weights 1/2, 1/3, …), so that a miscalibrated
            drafter is found out within a few probes.
        margin: speculation must beat plain decoding by this factor to start (``best_budget``,
            ``exploration``, ``futile``). At 1.03 the bets near the margin lost on the 2-core CPU, where
            a verification of 2-6 nodes costs 1.8-3.5 plain steps and a predicted gain of a few percent
            is within the model's error (HumanEval 0.95x plain, 2026-12-03: 20 such steps in 20
            prompts, one prompt 17 of them and 1.1 s lost).
        skip_futile: skip the probes that cannot lead to speculation (``futile``); False probes on the
            schedule alone.
        curve_probe: the least weight of a probe's gain curve in the running curve (the weight of other
            steps' curves is ``alpha``). A probe after a plain stretch of hundreds of steps is the only
            sample of the text now; at 0.2 one probe on an easy prompt after probes on hard ones left the
            curve where speculation did not pay (simulated, H200 costs, the prompts of
            ``futile_after``'s note: 0.98-1.00x plain time against 0.92-0.99x at 1.0). ``on_gpu``: 1.0 (a
            GPU probe is 15 deep once its size is explored, so its curve is a whole one); on the CPU,
            where probes are 1-3 deep and their curves extrapolated, 0.2.
        futile_after: probe cycles made before ``futile`` may skip a probe: the best curve of one or two
            probes says little about the prompts to come (simulated, H200 costs, a drafter right 85% of a
            position on a third of the prompts and 45% on the rest: a first probe on a hard prompt made
            every probe futile up to ``probe_cap``, 4,096 steps, and 3 of 19 easy answers speculated; after 4
            cycles one seed of 8 still never speculated, after 8 none: 0.93x plain time on average, and
            1.005x where the drafter never pays). ``on_gpu``: 8; on the CPU 0 (a probe cycle there costs
            a drafter pass over the prompt or 32 rows, and no budget has paid for the shipped drafter).
        keep: speculation under way goes on while it is predicted to run at this factor of plain
            decoding or better (a hysteresis: one threshold for starting and stopping made the ratio's
            noise stop it as often as it started). At 0.97 a run of bets predicted to lose up to 3% went
            on, against the bar of the automatic budget (never below 0.98x plain).
        prior_steps: the weight of the calibration's prior (one accepted per one predicted token), in
            speculative steps: the first steps' running means are plain means over the prior and them.
            At 1 the first four unlucky steps of a drafter right 75% of a position sent r from 1.39 to 0.71
            and stopped speculation that ran at 0.81x plain time (simulated, H200 costs).
        alpha_probe: the least weight of a probe's acceptance in the calibration (None: ``alpha_accept``).
            While plain decoding wins, probes are the calibration's only samples, spaced hundreds of steps
            apart; at ``alpha_accept`` (0.03) r took ~30 probes (~15,000 steps) to recover from an unlucky
            start. Over 8 seeds of 6,000 simulated steps on H200 costs, prior 4 and 0.3 took a drafter right
            75% of a position from 0.90x (worst 1.00x) to 0.84x (worst 0.95x) plain time and one right 80%
            from 0.65x (worst 0.68x) to 0.645x (worst 0.657x), and changed nothing where speculation does
            not pay (60-70%: 1.00x). A generation's first speculative step weighs as a probe (in the calibration
            and, with ``curve_probe``, the gain curve): speculation carried over from the last answer kept
            the last prompt's r and curve, and on the H200 two MT-Bench answers of 2026-12-04 speculated
            through 135 and 26 steps at 0.77-0.78x plain (the stats of the HumanEval-like answer before).
        measured_depth: the running gain curve remembers how deep it was measured (``_depth``): a probe
            drafts only its budget deep and the rest of its curve is extrapolated as a chain; the first
            deeper curve a step brings replaces that extrapolation beyond the depth instead of being
            blended into it. After a 1-deep probe that accepted, the extrapolation priced budget 31 at ~9
            tokens, and the blend (weight ``alpha`` a step) kept it there for 14 steps of ~1.5 (replayed
            MT-Bench: ``ddtree@auto`` 0.987 -> 0.988x plain, worst order 0.974 -> 0.978; `auto` 0.994 ->
            0.997, worst 0.987 -> 0.994).
        sizes: the node counts a verification may have (None: any up to the ceiling); budgets are these
            minus one. ``on_gpu``: ``GPU_SIZES``.
        size_keep: speculation under way keeps its budget while it is predicted at this factor of the best
            budget's rate or better (1.0: always the best), so that the pass keeps its shape.
        probe_gain: seconds that speculation saved between two probes (against plain steps emitting the
            same tokens), running mean over probe cycles (weight ``alpha_probe``) from 0. The probe spacing's floor is the cycle's cost net of it (``_spacing``): probes that
            start speculation worth more than they cost come on the doubling schedule, so a set where
            the drafter pays on some prompts and not on others gets re-probed every few prompts. With
            the floor from the cost alone (0.5% of plain time) a probe cycle of ~20 ms spaced the probes
            ~2,000 steps apart on the H200, eight 256-token answers: `auto` speculated on 2 of 15
            HumanEval prompts where DDTree@16 ran at 1.22x plain (2026-12-04). A sample counts between 0
            and ``PROBE_OUTLIER`` times the cycle's cost: one long winning run lifted the floor for many
            probes, and a losing one (speculation carried over into a harder text) pushed the probes out to
            ``probe_cap``.
        probe_at_start: a probe that comes due within a generation is made at its first step, with the
            prompt's features (``plan`` captures the prompt, ``begin`` makes the probe due): on a GPU a
            captured prefill costs a few ms and saves the probe's warm-up (32 capturing steps and a
            capture switch, ~13 ms on the H200) and a warm-up that an end-of-generation token cut short
            before its probe (30 of 180 budget generations on MT-Bench, 2026-12-04: ~3% of those
            answers). ``plan`` judges "within" by ``max_tokens``, an upper bound: the steps the probe came
            early are added to the next gap, so that the probes keep their spacing on average (with
            ``max_tokens`` far above the answers, a probe at every answer's start otherwise). Off on the
            CPU, where the prompt's injection costs a drafter pass over it.
        steady_costs: a pass's cost is recorded only from the third pass in a row of its size (on a GPU
            the first pass of a shape after another runs kernel by kernel and the second captures its
            CUDA graph; ggml-cuda replays from the third). The sizes' warm costs come from the warm-up at
            load (``decode.warmup``).
    """

    first_probe: int = 7
    probe_min: int = 8
    probe_max: int = 256
    recheck: int = 32
    window: int = 32
    overhead: float = 0.005
    probe_cap: int = 4096
    alpha: float = 0.2
    alpha_accept: float = 0.03
    margin: float = 1.08
    skip_futile: bool = True
    futile_after: int = 0
    curve_probe: float = 0.2
    keep: float = 1.0
    prior_steps: float = 4.0
    alpha_probe: float | None = 0.3
    sizes: tuple[int, ...] | None = None
    size_keep: float = 1.0
    steady_costs: bool = False
    probe_at_start: bool = False
    probe_gain: float = 0.0
    measured_depth: bool = True
    costs: PassCosts = field(default_factory=PassCosts)
    draft_s: float | None = None
    curve: np.ndarray | None = None
    best_curve: np.ndarray | None = None  # elementwise maximum of the gain curves seen (``futile``)
    accepted: float = 1.0   # running means of accepted and predicted drafted tokens per speculative
    predicted: float = 1.0  # step, from a prior of one each (``ratio``)
    probing: bool = False
    capture: bool = True
    probe_cost: float | None = None
    plain_s: float | None = None
    _since_probe: int = 0
    _probe_every: int = 8
    _plain_kept: int = 0
    _covered: int = SYNCED  # trailing committed tokens whose features the drafter has (or will have)
    _spec: bool = False     # the last choice was a speculative budget (not a probe)
    _warming: bool = False  # capturing ahead of a speculative step that found the drafter behind
    _cycle: float = 0.0     # extra seconds of the probe cycle under way
    _prompt_s: float = 0.0  # a captured prompt's seconds, until the generation's first step (``observe_prompt``)
    _earned: float = 0.0    # seconds speculative steps saved since the last probe (``probe_gain``)
    _run: float = 0.0       # seconds the speculation under way saved so far (< 0: lost). A run that
                            # stopped having lost keeps the probe schedule: re-probing it after
                            # ``probe_min`` steps restarted losing runs over and over on MT-Bench
                            # (replayed, lab/budget_replay.py: 0.982 / 0.964x plain against 0.987 / 0.973)
    _depth: int | None = None  # positions of ``curve`` measured (beyond: a probe's extrapolation)
    _fresh: bool = False    # no speculative step yet in this generation (its first one weighs as a probe's)
    _probe_planned: bool = False  # ``plan`` captures the prompt for a probe due within the generation
    _pulled: int = 0        # steps a probe came early at a generation's start (added to the next gap)
    _n_spec: int = 0        # speculative steps observed (the first one's drafting time is a warm-up)
    _n_cycles: int = 0      # probe cycles closed (the first one's cost is a warm-up)
    _gated: bool = False    # the probe due has been checked for futility (``futile``)
    _explored: int = 0      # pass size that the probe under way explores (0: none), and the largest
    _explored_from: int = 0  # measured size before it
    _last_b: int = 0        # the budget of the last choice (0: plain)
    _run_n: int = 0         # node count of the target's last pass, and how many passes in a row had it
    _run_len: int = 0

    def __post_init__(self):
        self._probe_every = self.probe_min

    @classmethod
    def on_gpu(cls, costs: PassCosts | None = None, **kw) -> "AutoBudget":
        """The budget for a target on a GPU: passes of ``GPU_SIZES`` nodes, a budget kept while within 3%
        of the best, and costs from steady passes only (the fields' notes)."""
        kw = {"sizes": GPU_SIZES, "size_keep": 0.97, "steady_costs": True, "probe_at_start": True,
              "curve_probe": 1.0, "futile_after": 8, **kw}
        return cls(costs=costs if costs is not None else PassCosts(), **kw)

    def budgets(self, k_max: int) -> np.ndarray:
        """The budgets a speculative step may take, up to ``k_max`` (int64 ``[m]``, ascending; empty when
        ``k_max`` < 1): 1 .. ``k_max``, or ``sizes`` minus one (``k_max`` itself when none fits)."""
        if k_max < 1:
            return np.zeros(0, dtype=np.int64)
        if self.sizes is None:
            return np.arange(1, k_max + 1)
        b = np.array(sorted({n - 1 for n in self.sizes if 1 <= n - 1 <= k_max}), dtype=np.int64)
        return b if len(b) else np.array([k_max], dtype=np.int64)

    def fit(self, b: int, k_max: int) -> int:
        """The largest allowed budget (``budgets``) at most ``min(b, k_max)``; 0 when that is below 1."""
        allowed = self.budgets(min(b, k_max))
        return int(allowed[-1]) if len(allowed) else 0

    @property
    def ratio(self) -> float:
        """Calibration r = accepted / predicted, clamped to [0.02, 2]: running means (weight ``alpha``)
        that start from a prior of one token each, so that r starts at 1 and no single probe sends it to
        a bound (a missed one-token probe used to set r to its floor, 0.02, and speculation then never
        looked worth a try on a set where it pays: HumanEval on the H200, 2026-12-02)."""
        if self.predicted <= 0:
            return 1.0
        return float(np.clip(self.accepted / self.predicted, 0.02, 2.0))

    def plan(self, max_tokens: int, k_max: int) -> bool:
        """Whether the prefill of a generation of ``max_tokens`` tokens (the prefill's included) with
        budgets up to ``k_max`` captures the prompt's features for the drafter: when speculation pays
        now, or the next probe falls within the generation (the probe then drafts with the prompt in the
        drafter's cache; with ``probe_at_start`` it comes at the first step). Otherwise nothing is
        captured until a probe comes near (``begin``). The prompt's rows go into the drafter at the
        prefill: queued for the probe instead, their injection (a drafter pass over the whole prompt,
        ~0.3 s on the 2-core CPU) stalled the stream mid-generation. Every row: a probe that got only
        the prompt's last 32 rows (H200, 2026-12-04, 40 prompts a set) rarely led to speculation, and
        `auto` fell from 1.22x / 1.06x plain on HumanEval / GSM8K to 0.99x / 0.99x."""
        k_max = min(k_max, max_tokens - 1)
        self._probe_planned = False
        if self._spec or self.curve is None or self.draft_s is None or not self.costs.known(1):
            return True
        if k_max >= 1 and best_budget(self.costs, self.draft_s, self._curve(k_max), self.ratio, k_max,
                                      margin=self.margin, budgets=self.budgets(k_max)) > 0:
            return True
        if self._probe_every - self._since_probe > max_tokens - 3:  # as its first ``choose`` will count
            return False
        self._probe_planned = not self.futile(k_max)
        return self._probe_planned

    def begin(self, captured: bool) -> None:
        """A generation starts; ``captured``: the drafter got every prompt token's features. Its first
        step decides afresh (a kept "plain wins" is dropped: ``plan`` may have found that drafting pays);
        with ``probe_at_start`` and the prompt captured, a probe due within the generation is due now."""
        self.capture = captured
        self._plain_kept = 0
        self._warming = False
        self._covered = SYNCED if captured else 0
        self._fresh = True
        if captured and self.probe_at_start and self._probe_planned:  # the planned probe now; the steps
            self._pulled = max(self._probe_every - self._since_probe, 0)  # it came early go to the next gap
            self._since_probe = max(self._since_probe, self._probe_every)
        self._probe_planned = False

    def choose(self, k_max: int, remaining: int | None = None) -> int:
        """Budget for the next step, at most ``k_max`` (0 = plain decoding); sets ``probing`` and ``capture``.

        ``remaining``: tokens the generation still wants (this step's included), None = unbounded: a
        plain stretch warms the drafter up only for a speculative step that can still come.
        """
        self.probing = False
        if k_max < 1 or not self.costs.known(1):
            return self._plain(self.capture)  # the first step measures a plain pass; no switch at the end
        if self.curve is None or self.draft_s is None:
            return self._speculate(self.fit(min(self.first_probe, k_max), k_max), probe=True, every=self._probe_every)
        if self._warming and self._covered < self.window:  # a warm-up, once begun, runs its course:
            return self._plain(True)                       # a decision near the margin would flip it
        self._warming = False
        b = self._decide(k_max)
        if b > 0:
            return self._speculate(b, probe=False, every=self.probe_min)
        if self._spec:  # speculation just stopped paying (a few unlucky steps can do it): re-probe soon,
            self._since_probe = 0  # not after the cost-spaced gap, if the run saved time (``_run``)
            if self._run > 0:
                self._probe_every = self.probe_min
            self._run = 0.0
        self._spec = False
        self._since_probe += 1
        due = self._probe_every + 1 - self._since_probe  # steps until the probe (0: this one)
        if due <= self.window and not self._gated:  # before its warm-up begins: can the probe matter?
            self._gated = True
            if self.futile(k_max):
                self._since_probe, self._gated = 0, False
                self._probe_every = min(2 * self._probe_every, self.probe_cap)
                return self._plain(False)
        if due > 0:
            return self._plain(due <= self.window and (remaining is None or due <= remaining - 2))
        b = best_budget(self.costs, self.draft_s, self._curve(k_max), self.ratio, k_max, speculative_only=True,
                        budgets=self.budgets(k_max))
        x = self.exploration(k_max)
        cold = [n for n in self.costs.cold() if n - 1 <= k_max and n - 1 in self.budgets(k_max)]
        if cold:  # a size's first pass was cold (a GPU loads its kernels): measure the largest such size
            b, x = cold[0] - 1, 0                # again before it prices anything (``PassCosts.cold``)
        b = self._speculate(max(b, x), probe=True, every=2 * self._probe_every)
        if b and b == x:
            self._explored, self._explored_from = x + 1, self.costs.largest(warm=True)
        return b

    def futile(self, k_max: int) -> bool:
        """Whether a probe now could not lead to speculation: no budget up to ``k_max`` beats plain
        decoding by the margin even with the best gain curve seen so far (``best_curve``, times the
        calibration r where it is above 1) and passes beyond the largest warm size no dearer than that
        size (the optimistic costs of ``exploration``). Such a probe is skipped and the gap doubles, up
        to ``probe_cap``, where the drafter is probed whatever the bound says (the text may have changed).
        On the 2-core CPU (a 2-node pass 2.3x a 1-token one, a 16-node pass 13x) no budget ever paid for
        the shipped drafter, and its probes, one per ~140 steps, cost 1-3% of the time."""
        if (not self.skip_futile or self.best_curve is None or self.draft_s is None
                or self._n_cycles < self.futile_after or self._probe_every >= self.probe_cap or k_max < 1):
            return False
        n_warm = max(self.costs.largest(warm=True), 1)
        b = self.budgets(k_max)
        c = np.asarray(self.costs.estimate(np.minimum(b + 1, n_warm)))
        g = max(self.ratio, 1.0) * extrapolate(self.best_curve[:k_max], k_max)[b - 1]
        return float(np.max((1.0 + g) / (c + self.draft_s))) <= self.margin / self.costs.estimate(1)

    def exploration(self, k_max: int) -> int:
        """The budget a due probe explores at (0: none): twice the nodes of the largest pass measured
        (at most ``k_max`` + 1), when speculation at ``k_max`` would beat plain decoding by the margin if
        passes beyond that largest size cost no more than it (the gain from the extrapolated curve)."""
        n_max = self.costs.largest(warm=True)
        if n_max < 2 or n_max > k_max:
            return 0
        flat = self.costs.estimate(n_max) + self.draft_s
        gain = 1.0 + self.ratio * float(self._curve(k_max)[k_max - 1])
        x = self.fit(min(2 * n_max, k_max + 1) - 1, k_max)
        return x if x > n_max - 1 and gain / flat > self.margin / self.costs.estimate(1) else 0

    def _plain(self, capture: bool) -> int:
        self._last_b = 0
        self.capture = capture
        self._covered = min(self._covered + 1, SYNCED) if capture else 0
        return 0

    def _speculate(self, b: int, probe: bool, every: int) -> int:
        """``b`` drafted tokens, once the drafter has the recent tokens' features (else a plain step
        that captures them: the choice is made again at the next step); ``every``: the next probe's
        gap before its floor (``_spacing``)."""
        if self._covered < self.window:
            self._warming = True
            return self._plain(True)
        self._since_probe, self._gated = -self._pulled if probe else 0, False
        self._pulled = 0
        self._probe_every = self._spacing(every)
        self.probing, self.capture, self._spec = probe, True, not probe
        self._covered = SYNCED
        self._last_b = b
        return b

    def _spacing(self, doubled: int) -> int:
        """Plain steps before the next probe: the doubling schedule (``probe_min`` .. ``probe_max``), at
        least what keeps probing within ``overhead`` of plain time, the cycle's cost net of what
        speculation saved since the last probe (``probe_gain``), at most ``probe_cap``."""
        n = min(max(doubled, self.probe_min), self.probe_max)
        c1 = self.plain_s if self.plain_s is not None else self.costs.estimate(1)
        if self.probe_cost is not None and c1 and self._n_cycles >= 2:  # the first cycle is a warm-up
            net = self.probe_cost - self.probe_gain
            n = max(n, int(np.ceil(net / (self.overhead * c1))))
        return min(n, self.probe_cap)

    def _decide(self, k_max: int) -> int:
        """``best_budget`` now, or 0 while an earlier "plain wins" is kept (``recheck``)."""
        if self._plain_kept > 0:
            self._plain_kept -= 1
            return 0
        margin = self.keep if self._spec else self.margin
        allowed = self.budgets(k_max)
        curve = self._curve(k_max)
        b = best_budget(self.costs, self.draft_s, curve, self.ratio, k_max, margin=margin, budgets=allowed)
        self._plain_kept = self.recheck - 1 if b == 0 else 0
        last = self._last_b
        if b and self._spec and last and last != b and last in allowed and self.size_keep < 1.0:
            r_last, r_best = predicted_rate(self.costs, self.draft_s, curve, self.ratio, [last, b])
            if r_last >= self.size_keep * r_best and r_last > margin / self.costs.estimate(1):
                b = last
        return b

    def stretch(self) -> int:
        """Plain steps without capture that certainly follow the last ``choose`` (0 or more): while a
        "plain wins" decision is kept (``recheck``) and the next probe's warm-up is further away, every
        choice would be plain decoding without capture, whatever the plain steps measure. The engine runs
        them as plain decoding's own steps (no drafter, no per-step budget work: ~10 µs a step, 0.5% of an
        H200 step) and reports them together with ``observe_stretch``. Call it after ``observe`` of the
        step that ``choose`` decided."""
        if self.probing or self._spec or self.capture or self._warming or self.curve is None:
            return 0
        return max(min(self._plain_kept, self._probe_every - self._since_probe - self.window), 0)

    def observe_stretch(self, n: int, verify_s: float, step_s: float) -> None:
        """``n`` plain steps without capture ran (a ``stretch``, or its first ``n`` steps when the
        generation ended): ``verify_s`` / ``step_s`` the seconds of their target passes (``StepRecord.
        t_verify``) and of their whole records (``t_step``), summed. The state moves as ``n`` calls of
        ``choose`` and ``observe`` would have moved it; the costs take the stretch's mean pass as one
        sample."""
        if n < 1:
            return
        self._since_probe += n
        self._plain_kept = max(self._plain_kept - n, 0)
        self._covered = 0
        if self._passed(1, n):
            self.observe_plain(verify_s / n)
        self.plain_s = running_cost(self.plain_s, step_s / n, self.alpha, False)

    def observe_prompt(self, seconds: float) -> None:
        """The prefill captured the prompt's features for the drafter: ``seconds`` of reading them and
        of the drafter's injection pass over the prompt (the engine's timing; the target's own share of
        the capture and a capture switch before the prefill are not in it). The generation's first step
        decides where it goes (``_account``): a probe's cycle (``probe_cost``) when that step is a probe
        or a plain step, what speculation saved (``probe_gain``) when it is a speculative one. On the
        H200 a captured prefill of the budget's generations took 11.2 ms + 0.005 ms a prompt token more
        than plain decoding's (2026-12-04, 300 generations of `auto` and `ddtree@auto`), more than a
        probe's own step, and was priced nowhere: with a probe at most answers' start
        (``probe_at_start``) MT-Bench's probes cost ~2% of plain decoding's time where ~0.5% was the aim."""
        if seconds > 0:
            self._prompt_s += seconds

    def observe(self, rec) -> None:
        """Learn from one decode step (a ``step.StepRecord``): a plain step's pass cost, or a speculative
        step's pass cost, drafting time, gain curve and acceptance; and what the probe cycle costs."""
        steady = self._passed(rec.n_nodes, 1)
        if rec.speculative:
            self.observe_spec(rec.n_nodes, rec.t_verify, rec.t_draft - rec.t_sync, rec.curve, rec.budget,
                              rec.n_accepted, record=steady, probe=rec.probe or self._fresh)
            self._fresh = False
        elif not rec.switched and steady:  # a switch may re-plan the graph (the first capture): no pass cost
            self.observe_plain(rec.t_verify)
        self._account(rec)

    def _passed(self, n_nodes: int, count: int) -> bool:
        """``count`` target passes of ``n_nodes`` ran; whether the last one's cost is to be recorded
        (``steady_costs``: the third pass in a row of its size or later)."""
        self._run_len = self._run_len + count if n_nodes == self._run_n else count
        self._run_n = n_nodes
        return not self.steady_costs or self._run_len >= 3

    def _account(self, rec) -> None:
        """Add a step's time beyond plain decoding of its tokens to the probe cycle under way: every step
        but a plain one without capture or switch; a probe closes the cycle (``probe_cost``)."""
        a = self.alpha
        prompt, self._prompt_s = self._prompt_s, 0.0  # a captured prompt's cost goes with this step's kind:
        self._cycle += prompt                          # the probe cycle, or (below) what speculation saved
        if not (rec.speculative or rec.capture or rec.switched):
            self.plain_s = running_cost(self.plain_s, rec.t_step, a, False)
            return
        c1 = self.plain_s if self.plain_s is not None else self.costs.estimate(1)
        if c1 is None:
            return
        if rec.speculative and not rec.probe:  # speculation pays: no probe cycle
            self._cycle = 0.0
            self._earned += c1 * len(rec.tokens) - rec.t_step - prompt
            self._run += c1 * len(rec.tokens) - rec.t_step
            return
        self._cycle += rec.t_step - c1 * len(rec.tokens)
        if rec.probe:
            # at least what the probe step itself cost beyond plain steps of its tokens, from the running
            # costs: the cycle's sum over tens of steps carries their noise (±5% a step on the 2-core
            # CPU, where it came out near 0 and the probes came every ~130 steps at ~1.5% of the time);
            # with this probe's injection of the deferred rows (``t_sync``: 10-30 ms there, left out
            # of ``draft_s``), which was missing from it until 2026-12-03 (probes every ~140 steps)
            own = (float(self.costs.estimate(rec.n_nodes)) + (self.draft_s or 0.0) + rec.t_sync
                   - c1 * len(rec.tokens))
            self.probe_cost = running_cost(self.probe_cost, max(self._cycle, own, 0.0), a, self._n_cycles == 1,
                                           cap=PROBE_OUTLIER)
            # what the speculation since the last probe saved, at most PROBE_OUTLIER cycles' cost (a long
            # winning run would lift the floor for many probes) and no less than nothing (a losing run,
            # e.g. carried over into another text, would push the probes out to ``probe_cap``)
            g = self.alpha_probe if self.alpha_probe is not None else a
            earned = min(max(self._earned, 0.0), PROBE_OUTLIER * (self.probe_cost or 0.0))
            self.probe_gain = (1 - g) * self.probe_gain + g * earned
            self._n_cycles += 1
            self._cycle = self._earned = 0.0
            self._probe_every = self._spacing(self._probe_every)
            if self._explored and self.costs.samples(self._explored) < 2:
                self._probe_every = self.probe_min  # its first pass was cold: measure it again soon
            elif self._explored:  # a pass no dearer than 1.5x the previous largest: explore on soon
                grew = self.costs.estimate(self._explored) / self.costs.estimate(self._explored_from)
                if grew < 1.5:
                    self._probe_every = self.probe_min
                self._explored = self._explored_from = 0

    def observe_plain(self, seconds: float) -> None:
        """A plain step's target pass (1 token) took ``seconds``."""
        self.costs.record(1, seconds)

    def observe_spec(self, n_nodes: int, verify_s: float, draft_s: float, curve: np.ndarray,
                     budget: int, accepted: int, record: bool = True, probe: bool = False) -> None:
        """A speculative step: ``n_nodes`` verified in ``verify_s``, drafting took ``draft_s``,
        ``curve`` its gain curve, ``budget`` drafted tokens of which ``accepted`` were accepted;
        ``record``: the pass's cost enters ``costs``."""
        a = self.alpha
        self._plain_kept = 0
        if record:
            self.costs.record(n_nodes, verify_s)
        self.draft_s = running_cost(self.draft_s, draft_s, a, self._n_spec == 1)
        self._n_spec += 1
        w = max(a, self.curve_probe) if probe else a
        self.curve = self._blend(self.curve, curve, w, self._depth if self.measured_depth else None)
        self._depth = len(curve) if w >= 1.0 or self._depth is None else max(self._depth, len(curve))
        n = max(len(curve), 0 if self.best_curve is None else len(self.best_curve))
        new = _extend(np.asarray(curve, dtype=np.float64), n)
        self.best_curve = new if self.best_curve is None else np.maximum(_extend(self.best_curve, n), new)
        pred = float(curve[budget - 1]) if budget >= 1 else 0.0
        a = max(self.alpha_accept, 1.0 / (self._n_spec + self.prior_steps))  # a mean from the prior, then running
        if probe and self.alpha_probe is not None:
            a = max(a, self.alpha_probe)
        self.accepted = (1 - a) * self.accepted + a * accepted
        self.predicted = (1 - a) * self.predicted + a * pred

    def _curve(self, k_max: int) -> np.ndarray:
        return extrapolate(self.curve[:k_max], k_max)

    @staticmethod
    def _blend(old: np.ndarray | None, new: np.ndarray, a: float, depth: int | None = None) -> np.ndarray:
        if old is None:
            return np.asarray(new, dtype=np.float64).copy()
        n = max(len(old), len(new))
        nw = extrapolate(new, n)
        out = (1 - a) * extrapolate(old, n) + a * nw
        if depth is not None and 0 < depth < len(new):  # beyond the old curve's measured depth: the new
            out[depth:] = out[depth - 1] + nw[depth:] - nw[depth - 1]  # curve's increments (never falling)
        return out
