"""The automatic budget's policy: the choice per step, capture around plain stretches, GPU pass shapes."""
from __future__ import annotations

import numpy as np
import pytest

from budget_helpers import WEAK, LinearCosts, _drive, _simulate, _weak_auto, h200_pass, policy
from tfm_local.decode.budget import PassCosts, gain_curve

def test_auto_budget_first_plain_then_probe_then_backs_off():
    auto = policy(costs=LinearCosts(0.035, 0.06), skip_futile=False)  # the schedule alone
    auto.costs.known = lambda n: False
    assert auto.choose(15) == 0  # nothing measured: a plain step first
    auto.costs.known = lambda n: True
    assert auto.choose(15) == 7 and auto.probing  # first probe, 7 tokens deep (first_probe)
    weak = gain_curve(np.log(np.full(15, 0.05)) * np.arange(1, 16), 15)
    auto.observe_spec(5, 0.35, 0.03, weak, 4, 0)
    gaps, since = [], 0
    for _ in range(1000):
        b = auto.choose(15)
        since += 1
        assert auto.probing == (b > 0)
        if b:
            gaps.append(since)
            since = 0
            auto.observe_spec(b + 1, 0.1, 0.03, weak, b, 0)
    assert gaps[:4] == [9, 17, 33, 65]  # plain steps between probes double (8, 16, 32, 64) ...
    assert max(gaps) == 257 and gaps[-2:] == [257, 257]  # ... up to 256


def test_auto_budget_goes_speculative_when_it_pays_and_calibrates():
    auto = policy(costs=LinearCosts(0.004, 0.00002))
    strong = gain_curve(np.log(np.full(15, 0.9)) * np.arange(1, 16), 15)
    auto.observe_spec(16, 0.005, 0.001, strong, 15, 3)
    a = 1 / (1 + auto.config.prior_steps)  # the mean with a prior of 1 / 1 worth prior_steps steps
    assert auto.ratio == pytest.approx((1 - a + a * 3) / (1 - a + a * strong[14]))
    assert auto.choose(15) == 15 and not auto.probing
    assert auto.choose(7) == 7


def test_a_budget_1_probe_can_show_that_a_deeper_budget_pays():
    """Pass costs of this project's 2-core CPU (66 ms for 1 token, 100 for 2, 112 for 4: fourteenth
    session) and a probe one token deep that the drafter predicts at 0.85: budget 1 alone does not pay
    ((1 + 0.85) / (100 + 20) ms < 1 / 66 ms · 1.03), budget 3 does; a flat continuation of the probe's
    one-point curve hid that, and the engine then never speculated on HumanEval."""
    costs = PassCosts()
    for n, ms in ((1, 66), (2, 100), (3, 106), (4, 112), (8, 202), (16, 253)):
        costs.record(n, ms / 1e3)
    auto = policy(costs=costs, first_probe=1)
    assert auto.choose(15) == 1 and auto.probing
    auto.observe_spec(2, 0.100, 0.020, np.array([0.85]), 1, 1)
    assert auto.choose(15) >= 3 and not auto.probing


def test_auto_budget_keeps_a_plain_decision_for_recheck_steps(monkeypatch):
    """While plain wins, best_budget runs once per ``recheck`` plain steps (plus the probes); a
    speculative step's statistics make the next choice compute it again."""
    import tfm_local.decode.budget.policy as budget

    calls = []
    real = budget.best_budget
    monkeypatch.setattr(budget, "best_budget", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    auto = policy(costs=LinearCosts(0.035, 0.06), recheck=4, skip_futile=False)
    weak = gain_curve(np.log(np.full(15, 0.05)) * np.arange(1, 16), 15)
    auto.observe_spec(5, 0.35, 0.03, weak, 4, 0)
    assert [auto.choose(15) for _ in range(8)] == [0] * 8   # the first probe comes after 8 plain steps
    assert len(calls) == 2                      # steps 1 and 5
    strong = gain_curve(np.log(np.full(15, 0.99)) * np.arange(1, 16), 15)
    for _ in range(20):                         # the text turns easy: a spec step's stats arrive
        auto.observe_spec(16, 0.036, 0.001, strong, 15, 15)
    assert auto.choose(15) > 0 and len(calls) == 3


def test_a_plain_stretch_captures_only_its_last_window_steps():
    """Capture is off through a plain stretch but for the ``window`` steps before the probe, whose rows
    the drafter then has; a stretch no longer than the window keeps it on (no switch, no hole)."""
    auto = _weak_auto(probe_min=20, window=4)
    got = [(auto.choose(15), auto.capture) for _ in range(21)]
    assert got[:20] == [(0, False)] * 16 + [(0, True)] * 4
    assert got[20][0] > 0 and got[20][1] and auto.probing
    short = _weak_auto(probe_min=8, window=32)
    assert [(short.choose(15), short.capture) for _ in range(8)] == [(0, True)] * 8
    # no warm-up for a probe that the generation cannot reach
    cut = _weak_auto(probe_min=20, window=4)
    assert [(cut.choose(15, remaining=20 - i), cut.capture)[1] for i in range(18)] == [False] * 18


def test_speculation_that_starts_paying_mid_stretch_warms_the_drafter_up_first():
    """A decision for speculation after steps without capture comes ``window`` capturing plain steps
    later (the drafter would draft without the recent tokens otherwise); with the drafter in sync
    (after a prefill that captured) it comes at once."""
    auto = _weak_auto(probe_min=100, window=5)
    for _ in range(10):
        assert auto.choose(15) == 0 and not auto.capture
    auto.costs = LinearCosts(0.004, 0.00002)  # GPU-like costs and a drafter that is right: speculation pays
    auto.gain.curve = gain_curve(np.log(np.full(15, 0.9)) * np.arange(1, 16), 15)
    auto.draft_s, auto.gain.accepted, auto.gain.predicted, auto._plain_kept = 0.001, 0.0, 0.0, 0
    got = [(auto.choose(15), auto.capture) for _ in range(6)]
    assert got[:5] == [(0, True)] * 5 and got[5][0] > 0 and got[5][1] and not auto.probing
    assert auto.capture_prompt(64, 15)  # speculation pays: the next prefill captures
    auto.begin(True)
    assert auto.choose(15) > 0


def test_plan_captures_the_prompt_only_when_the_generation_can_draft():
    auto = policy(costs=LinearCosts(0.035, 0.06))
    assert auto.capture_prompt(8, 15)  # nothing known yet: the first probe comes at once
    auto = _weak_auto(probe_min=100)
    assert not auto.capture_prompt(64, 15) and auto.capture_prompt(128, 15)
    auto.begin(False)
    assert not auto.capture and auto._covered == 0
    gpu = _weak_auto(probe_min=100, probe_at_start=True)  # on a GPU the probe comes at the first step
    assert gpu.capture_prompt(128, 15)
    gpu.begin(True)
    assert gpu.choose(15) > 0 and gpu.probing


def test_a_warm_up_runs_its_course():
    """A decision near the margin must not switch the capture on and off: once a warm-up has begun it
    captures ``window`` steps, and only then is the choice made again."""
    auto = _weak_auto(probe_min=100, window=5)
    for _ in range(10):
        auto.choose(15)
    cpu, auto.costs = auto.costs, LinearCosts(0.004, 0.00002)
    auto.gain.curve = gain_curve(np.log(np.full(15, 0.9)) * np.arange(1, 16), 15)
    auto.draft_s, auto.gain.accepted, auto.gain.predicted, auto._plain_kept = 0.001, 0.0, 0.0, 0
    assert (auto.choose(15), auto.capture) == (0, True)
    auto.costs, auto.gain.curve = cpu, WEAK  # plain wins again
    assert [(auto.choose(15), auto.capture) for _ in range(4)] == [(0, True)] * 4
    assert (auto.choose(15), auto.capture) == (0, False)


def test_a_cold_start_and_a_missed_first_probe_do_not_price_speculation_out():
    """H200-like costs where speculation pays (a 1-token pass 1.9 ms, n tokens 1.9 + 0.15·n ms, drafting
    2 ms, a drafter right 85% of the time per position), with the first pass of every size 10x slower
    (CUDA graph capture), the first drafting 19 ms, and the first probe missing its one token: the
    budget still turns to speculation within a few hundred steps and stays there. Before, the cold
    costs were averaged in and the missed probe set the calibration to its floor (0.02): the engine
    decoded plainly through a whole HumanEval run where DDTree@16 ran at 1.16x plain."""
    auto = policy(costs=PassCosts())
    strong = gain_curve(np.log(np.full(15, 0.85)) * np.arange(1, 16), 15)
    seen, spec, n_probes = set(), [], 0
    for step in range(800):
        k = auto.choose(15)
        n = k + 1
        t = (0.0019 + 0.00015 * (n - 1)) * (10 if n not in seen else 1)
        seen.add(n)
        if k:
            first = n_probes == 0
            n_probes += auto.probing
            draft = 0.019 if first else 0.002
            accepted = 0 if first else int(np.floor(strong[k - 1]))
            curve = strong[:k] if auto.probing else strong
            auto.observe_spec(n, t, draft, curve, k, accepted)
        else:
            auto.observe_plain(t)
        spec.append(k > 0)
    assert n_probes >= 1 and auto.ratio > 0.5
    assert np.mean(spec[-300:]) > 0.9  # speculating, not probing now and then


def _attr(obj, dotted: str):
    """``obj``'s attribute along a dotted path ("probes.since")."""
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def test_a_stretch_moves_the_state_as_its_steps_would():
    """The steps ``stretch`` promises are the plain steps without capture that step-by-step choices
    make, and ``observe_stretch`` leaves the chooser where those steps would have: the same choices
    (probes, warm-ups) follow, while the per-step budget work runs once per stretch."""
    a, b = _weak_auto(probe_min=300, window=8), _weak_auto(probe_min=300, window=8)
    stretched = []
    real = b.observe_stretch
    b.observe_stretch = lambda n, v, s: stretched.append(n) or real(n, v, s)
    assert _drive(a, 2000, False) == _drive(b, 2000, True)
    assert sum(stretched) > 1500 and max(stretched) == b.config.recheck - 1
    for name in ("probes.since", "probes.every", "_plain_kept", "_covered", "capture", "probing"):
        assert _attr(a, name) == _attr(b, name), name
    assert a.probes.plain_s == pytest.approx(b.probes.plain_s)


def test_no_stretch_while_capturing_probing_or_before_statistics():
    auto = policy(costs=LinearCosts(0.035, 0.06))
    auto.choose(15)
    assert auto.stretch() == 0  # no gain curve yet: the next step probes
    auto = _weak_auto(probe_min=20, window=8)
    got = []
    for _ in range(21):
        k = auto.choose(15)
        got.append((k, auto.capture, auto.stretch()))
    # a kept "plain wins" (recheck 32) until the warm-up: 12 steps without capture, the stretch after
    # each counting down to the warm-up; then 8 capturing steps and the probe, with no stretch
    assert got == [(0, False, 11 - i) for i in range(12)] + [(0, True, 0)] * 8 + [(got[20][0], True, 0)]
    assert got[20][0] > 0 and auto.probing


def test_speculation_that_pays_is_not_stopped_by_the_ratios_noise():
    """A drafter right 75% of the time on H200-like costs: speculation at 15 runs at ~0.81x plain time.
    One threshold for starting and stopping, with the accepted/predicted ratio at weight 0.05, let its
    noise stop speculation every ~200 steps, and probes 256 steps apart restarted it after ~1,000:
    0.96x plain time over 6,000 steps (simulated, four seeds). Speculation under way now goes on while
    predicted at ``keep`` (0.97x) of plain decoding or better."""
    ratios = []
    for seed in range(4):
        run = policy(costs=PassCosts())
        got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.75, capture_s=0.00002, probe_extra_s=0.003,
                        first_probe_extra_s=0.03, cold_pass_s=0.028, seed=seed)
        ratios.append(got["ratio"])
    assert np.mean(ratios) < 0.92


def test_on_a_gpu_the_budget_keeps_few_pass_shapes():
    """H200 (docs/gpu.md): with every size allowed the budget moved by one node a step (16,
    15, 14, … 5 on HumanEval); upstream ggml-cuda keeps one CUDA graph per context, so each pass of a new
    size ran kernel by kernel (a speculative step 8.2 ms against DDTree@16's steady 6.6), that cost priced
    its size out, the next size down was tried, and the budget stopped speculating where DDTree@16 ran at
    1.2x plain. Simulated with the same penalty (4 ms on the first two passes of a size after another)
    and the warm-up's costs: every size allowed, a HumanEval-like drafter ends in plain decoding; with
    the GPU profile (passes of ``GPU_SIZES`` nodes, a size kept within 3% of the best, costs of
    steady passes only) it speculates at 15 and runs at ~0.5x plain time."""
    kw = dict(capture_s=0.00002, probe_extra_s=0.003, switch_pass_s=0.004)
    every = policy(costs=PassCosts())
    got = _simulate(every, 6000, 0.00195, h200_pass, 0.0018, 0.85, warm=tuple(range(1, 17)), seed=0, **kw)
    assert got["ratio"] > 0.98 and len(set(got["budgets"])) > 5
    for seed in range(3):
        gpu = policy(gpu=True)
        got = _simulate(gpu, 6000, 0.00195, h200_pass, 0.0018, 0.85, warm=(1, 2, 4, 8, 16), seed=seed, **kw)
        assert set(got["budgets"]) <= {0, 1, 3, 7, 15}
        assert got["ratio"] < 0.55 and np.mean([b > 0 for b in got["budgets"][500:]]) > 0.95
    weak = policy(gpu=True)  # and where speculation does not pay, it stays within 0.5% of plain
    got = _simulate(weak, 20_000, 0.00195, h200_pass, 0.0018, 0.55, warm=(1, 2, 4, 8, 16), **kw)
    assert got["ratio"] < 1.005


def test_gpu_budgets_are_the_sizes_allowed_and_costs_come_from_steady_passes():
    """``BudgetConfig.budgets`` / ``fit`` on ``GPU_SIZES`` (node counts 2, 4, 8, …: budgets 1, 3, 7, …),
    every size on the CPU; with ``steady_costs`` a pass's cost is recorded from the third pass in a row
    of its size (the first two after another shape run without a replayed CUDA graph)."""
    from tfm_local.decode.budget import GPU_SIZES
    from tfm_local.decode.step import StepRecord

    gpu, cpu = policy(gpu=True), policy()
    assert gpu.config.sizes == GPU_SIZES and list(gpu.budgets(15)) == [1, 3, 7, 15]
    assert list(gpu.budgets(10)) == [1, 3, 7] and list(gpu.budgets(0)) == []
    assert list(cpu.budgets(4)) == [1, 2, 3, 4]
    assert (gpu.config.fit(12, 63), gpu.config.fit(7, 63), gpu.config.fit(2, 63), gpu.config.fit(0, 63), gpu.config.fit(40, 20)) == (7, 7, 1, 0, 15)
    assert cpu.config.fit(12, 63) == 12
    passes = [(8, 0.010), (8, 0.010), (8, 0.004), (8, 0.004), (1, 0.006), (1, 0.006), (1, 0.002)]
    for n, t in passes:
        rec = StepRecord(pos=0, budget=n - 1, n_nodes=n, tokens=[1], capture=True,
                         curve=gain_curve(np.log(np.full(n - 1, 0.8)) * np.arange(1, n), n - 1) if n > 1 else None)
        rec.phases["verify"], rec.phases["drafter"] = t, 0.001 * (n > 1)
        gpu.observe(rec)
    assert gpu.costs.samples(8) == 2 and gpu.costs.estimate(8) == pytest.approx(0.004)
    assert gpu.costs.samples(1) == 1 and gpu.costs.estimate(1) == pytest.approx(0.002)


def test_an_unlucky_start_or_probe_does_not_end_speculation_for_good():
    """A drafter right 75% of a position on H200 costs (speculation at 15 runs at ~0.81x plain time): with
    the calibration's prior worth one step and probes at the running weight (0.03), a few unlucky first
    steps sent r to ~0.7 and speculation stopped; the probes, hundreds of steps apart, each moved r by 3%
    and it stayed plain for the rest of the run in 2 of 8 seeds. With the prior worth 4 steps and probes
    weighed at least 0.3 every seed speculates."""
    ratios = []
    for seed in range(8):
        run = policy(gpu=True)
        got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.75, capture_s=0.00002, probe_extra_s=0.003,
                        warm=(1, 2, 4, 8, 16), seed=seed)
        ratios.append(got["ratio"])
    assert max(ratios) < 0.97 and np.mean(ratios) < 0.87
    old = [_simulate(policy(gpu=True, prior_steps=1, alpha_probe=None), 6000, 0.00195, h200_pass, 0.0018,
                     0.75, capture_s=0.00002, probe_extra_s=0.003, warm=(1, 2, 4, 8, 16), seed=s)["ratio"]
           for s in range(8)]
    assert max(old) > 1.0 and np.mean(old) > 0.88


def test_a_generations_first_speculative_step_weighs_as_a_probe():
    """Speculation carried over from the last answer keeps that answer's calibration and gain curve; its
    first step in a new generation enters with a probe's weights (``alpha_probe``, ``curve_probe``), the
    steps after it with the running ones (H200 MT-Bench: two answers speculated through 135
    and 26 steps at 0.77-0.78x plain on the statistics of the answer before)."""
    from tfm_local.decode.step import StepRecord

    auto = policy(gpu=True, costs=LinearCosts(0.002, 0.00002))
    strong = gain_curve(np.log(np.full(15, 0.9)) * np.arange(1, 16), 15)
    for _ in range(50):  # a long run of a drafter right 90% of a position
        auto.observe_spec(16, 0.004, 0.0015, strong, 15, 6)
    auto._spec = True

    def step():
        rec = StepRecord(pos=0, budget=15, n_nodes=16, tokens=[1], curve=WEAK)
        rec.phases["verify"], rec.phases["drafter"] = 0.004, 0.0015
        auto.observe(rec)

    auto.begin(True)
    a0 = auto.gain.accepted
    step()
    a1 = auto.gain.accepted
    assert a1 == pytest.approx(0.7 * a0) and auto.gain.curve[-1] == pytest.approx(WEAK[-1])  # a probe's weights
    step()
    assert auto.gain.accepted == pytest.approx(0.97 * a1)  # the running weight (0.03) from the second step on


def test_on_the_cpu_a_step_drafts_just_past_its_budget_and_is_priced_by_its_depth():
    """The CPU profile drafts ``draft_ahead`` (2) nodes past the budget and prices each budget's drafting
    at that depth (``DraftCosts``); the GPU profile drafts to the block's end at one cost. With the costs
    of the 2-core CPU (a 1-token pass 66 ms, 4 tokens 90 ms; the drafter 17 ms at depth 3, 39 ms for the
    whole block) and a chat-like drafter (55% acceptance per position), a shallow chain pays; priced at
    the whole block's drafting cost, as before, no budget beats plain decoding by the margin."""
    costs = PassCosts()
    for n, s in [(1, 0.066), (2, 0.077), (4, 0.090), (8, 0.129), (16, 0.206)]:
        costs.record(n, s)
        costs.record(n, s)
    curve = gain_curve(np.log(np.full(15, 0.55)) * np.arange(1, 16), 15)
    cpu, gpu = policy(costs=costs), policy(costs=costs, gpu=True)
    assert cpu.config.draft_ahead == 2 and gpu.config.draft_ahead is None
    assert list(cpu.depth(np.array([1, 3, 13, 15]), 15)) == [3, 5, 15, 15] and gpu.depth(3, 15) == 15
    for auto in (cpu, gpu):
        auto.gain.curve, auto.gain.depth = curve, 15
    cpu.draft_s = 0.039  # one cost at every depth: the whole block's
    assert cpu.drafting(15) == 0.039 and cpu._decide(15) == 0
    cpu.draft_costs.record(3, 0.017)  # one (maybe cold) sample of a depth does not price yet
    assert cpu.drafting(15) == 0.039
    for d, s in [(3, 0.017), (5, 0.0185), (15, 0.039)]:  # measured by depth (as observe_spec records them)
        cpu.draft_costs.record(d, s)
        cpu.draft_costs.record(d, s)
    cpu._plain_kept = 0  # the "plain wins" just decided is not kept (a study's restart)
    b = cpu._decide(15)
    assert 1 <= b <= 4
    np.testing.assert_allclose(cpu.drafting(15)(np.array([1, 3, 13])), [0.017, 0.0185, 0.039])
    plan = cpu.plan(15)
    assert plan.budget == b and plan.depth == b + 2 and not plan.probe


def test_a_speculative_step_records_its_drafting_cost_at_the_depth_it_drafted():
    auto = policy(costs=LinearCosts(0.035, 0.06))
    auto.observe_spec(6, 0.3, 0.020, WEAK, 4, 1, depth=6)
    auto.observe_spec(6, 0.3, 0.020, WEAK, 4, 1, depth=6)
    auto.observe_spec(4, 0.2, 0.012, WEAK, 3, 1)  # no depth: the budget's
    assert auto.draft_costs.estimate(6) == pytest.approx(0.020) and auto.draft_costs.known(3)
    assert auto.draft_s is not None
