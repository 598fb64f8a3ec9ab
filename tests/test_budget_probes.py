"""Probe scheduling: spacing by measured cost, futile probes, exploration, the cycle's account."""
from __future__ import annotations

import numpy as np
import pytest

from budget_helpers import (WEAK, LinearCosts, _probe_gaps, _record, _simulate, _simulate_generations, _weak_auto,
                            h200_pass, policy)
from tfm_local.decode.budget import PassCosts, gain_curve

def test_probes_that_cannot_lead_to_speculation_are_skipped():
    """CPU-like costs and a weak drafter (5% a position): no budget could pay even at the best curve
    seen with passes no dearer than one token, so the due probes are skipped (no warm-up either), the
    gap doubling up to ``probe_cap``, where the drafter is probed whatever the bound says. A strong
    curve seen once keeps the probes on their schedule; so does ``skip_futile=False``."""
    auto = policy(costs=LinearCosts(0.035, 0.06), probe_cap=1024)
    auto.observe_spec(5, 0.35, 0.03, WEAK, 4, 0)
    assert auto.futile(15)
    gpu = policy(costs=LinearCosts(0.035, 0.06), probe_cap=1024, futile_after=8)  # ``on_gpu``'s
    gpu.observe_spec(5, 0.35, 0.03, WEAK, 4, 0)
    assert not gpu.futile(15)  # not before ``futile_after`` probe cycles
    gpu.probes.n_cycles = 8
    assert gpu.futile(15)
    gaps, captured = _probe_gaps(auto, 6000, WEAK)
    assert 2 <= len(gaps) <= 6 and min(gaps) >= 1024
    assert captured <= len(gaps) * auto.config.window  # capture only before the probes made
    assert not auto.capture_prompt(2000, 15) or auto.probes.every >= auto.config.probe_cap  # no prompt capture for a skipped probe

    sched = policy(costs=LinearCosts(0.035, 0.06), probe_cap=1024, skip_futile=False)
    sched.observe_spec(5, 0.35, 0.03, WEAK, 4, 0)
    assert len(_probe_gaps(sched, 6000, WEAK)[0]) >= 20

    once = policy(costs=LinearCosts(0.035, 0.06), probe_cap=1024)
    once.observe_spec(16, 0.35, 0.03, gain_curve(np.log(np.full(15, 0.99)) * np.arange(1, 16), 15), 15, 0)
    assert not once.futile(15)  # the best curve seen could pay: the text may turn easy again
    assert len(_probe_gaps(once, 6000, WEAK)[0]) >= 20


def test_probes_are_spaced_by_their_measured_cost():
    """Plain steps of 30 ms, a probe 90 ms (no token gained), a capturing step 1 ms more, a capture
    switch 10 ms: the probe cycle's cost sets the gap between probes so that probing stays within
    ``overhead`` (0.5%) of plain decoding, and probes still come (the doubling alone probed every 256
    steps: 3% here)."""
    auto = policy(costs=PassCosts(), skip_futile=False)
    total, probes, was = 0.0, 0, True
    n = 30_000
    for _ in range(n):
        k = auto.choose(15)
        switched, was = auto.capture != was, auto.capture
        t = (0.09 if k else 0.03 + 0.001 * auto.capture) + 0.01 * switched
        probes += k > 0
        total += t
        auto.observe(_record(k, t, auto, switched))
    assert auto.probes.probe_cost == pytest.approx(0.06 + 0.02 + 32 * 0.001, rel=0.05)
    assert auto.probes.every >= auto.probes.probe_cost / (auto.config.overhead * 0.03)
    assert total / (n * 0.03) - 1 < auto.config.overhead + 0.002
    assert probes >= 20


def test_probe_spacing_is_capped():
    auto = policy(costs=PassCosts(), probe_cap=500)
    auto.observe_plain(0.03)
    auto.probes.probe_cost, auto.probes.n_cycles = 10.0, 2  # a probe as dear as 333 plain steps: the 1% floor would be 33,333
    assert auto.probes.spacing(8, auto.config, auto.costs) == 500


def test_many_short_generations_cost_what_plain_decoding_costs():
    """Generations of 160 tokens (asked for 256) while speculation loses: plain steps of 1.9 ms, a
    capturing step 0.02 ms more, a capture switch 0.3 ms (a graph rebuild), a probe 5.5 ms for one
    token. Across generations the probes keep their spacing and decoding costs at most ~1% more than
    plain."""
    auto = policy(costs=PassCosts(), skip_futile=False)
    state, total, plain, probes = True, 0.0, 0.0, 0
    n_gen, length = 200, 160
    for _ in range(n_gen):
        cap = auto.capture_prompt(256, 15)
        switch_first, state = cap != state, cap
        auto.begin(cap)
        for i in range(length - 1):
            k = auto.choose(15, 255 - i)
            switched = switch_first or auto.capture != state
            switch_first, state = False, auto.capture
            t = (0.0055 if k else 0.0019 + 0.00002 * auto.capture) + 0.0003 * switched
            total, plain, probes = total + t, plain + 0.0019, probes + (k > 0)
            auto.observe(_record(k, t, auto, switched))
    assert total / plain - 1 < 0.012
    assert probes >= 20  # the drafter is still probed now and then


def test_exploration_finds_the_budget_a_gpu_can_afford():
    """H200-like costs: a plain step 1.95 ms, probe-sized passes 4.0 ms, 17 nodes 4.3 ms, drafting 1.8
    ms, a probe cycle 20 ms more, a drafter right 85% of the time (HumanEval-like): the chain at 15 runs
    at ~1.8x plain. A probe explores twice the largest pass measured while speculation would pay were
    larger passes no dearer, and the next probe comes soon when the pass was no dearer; the budget
    reaches 15 within a few probes and stays there (the ratio of accepted to predicted tokens averaged
    at weight 0.05: at 0.2, with probes one token deep, its swings ended speculation for the
    cost-spaced gap of ~2,000 steps). Each size is measured twice: a size measured once is cold."""
    def twice(a, *args):
        a.observe_spec(*args)
        a.observe_spec(*args)

    auto = policy(costs=PassCosts())
    auto.observe_plain(0.00195)
    twice(auto, 2, 0.0040, 0.0018, gain_curve(np.log([0.85]), 1), 1, 1)
    assert auto.exploration(15) == 3  # the first probe's 2-node pass: explore 4 nodes
    twice(auto, 4, 0.00402, 0.0018, gain_curve(np.log(np.full(3, 0.85)) * np.arange(1, 4), 3), 3, 2)
    assert auto.exploration(15) == 7 and auto.exploration(5) == 5
    cpu = policy(costs=PassCosts())  # passes linear in their size: no exploration past 4 nodes
    cpu.observe_plain(0.035)
    twice(cpu, 2, 0.070, 0.05, gain_curve(np.log([0.85]), 1), 1, 1)
    twice(cpu, 4, 0.140, 0.05, gain_curve(np.log(np.full(3, 0.85)) * np.arange(1, 4), 3), 3, 2)
    assert cpu.exploration(15) == 7  # were passes beyond 4 nodes no dearer, 16 would pay: one more look
    twice(cpu, 8, 0.280, 0.05, gain_curve(np.log(np.full(7, 0.85)) * np.arange(1, 8), 7), 7, 4)
    assert cpu.exploration(15) == 0

    run = policy(costs=PassCosts())
    got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.85, capture_s=0.00002, probe_extra_s=0.02)
    late = got["budgets"][-1000:]
    assert np.mean([b > 0 for b in late]) > 0.9 and np.median(late) >= 8
    assert got["ratio"] < 0.6  # ~1.7x faster than plain decoding over the run, probes included
    assert run.costs.largest() >= 16


def test_a_cold_first_probe_cycle_does_not_space_the_probes_out():
    """An H200 run: the first probe cycle of a process is cold (the drafter's first
    pass, CUDA graphs of new shapes: 27.7 ms beyond its parts' ~5 ms), and its cost set
    the gap to the next probe at ~2,900 steps (0.5% of plain time), so on HumanEval the budget made
    2-3 probes in 6,000 tokens and never speculated where DDTree@16 ran at 1.21x plain. The first
    cycle is a warm-up: its cost does not space the probes; the second cycle's replaces it."""
    run = policy(costs=PassCosts())
    got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.85, capture_s=0.00002, probe_extra_s=0.003,
                    first_probe_extra_s=0.03)
    assert np.mean([b > 0 for b in got["budgets"][500:]]) > 0.9 and got["ratio"] < 0.6  # within 500 steps
    weak = policy(costs=PassCosts())  # and where speculation does not pay, probing stays cheap
    got = _simulate(weak, 20_000, 0.00195, h200_pass, 0.0018, 0.55, capture_s=0.00002, probe_extra_s=0.003,
                    first_probe_extra_s=0.03)
    assert got["ratio"] < 1.008


def test_exploration_stops_where_passes_grow_with_their_size():
    """CPU-like costs (every pass linear in its size: 35 ms a node, drafting 50 ms) with the same
    drafter: exploration measures a pass or two, finds them dear and stops; over 30,000 steps the
    engine costs at most 1.5% more than plain decoding. And where the drafter is weak on the GPU
    (MT-Bench-like, 55% a position) speculation never pays and nothing is explored."""
    cpu = policy(costs=PassCosts())
    got = _simulate(cpu, 30_000, 0.035, lambda n: 0.035 * n, 0.05, 0.85, capture_s=0.0005, probe_extra_s=0.05)
    assert got["ratio"] < 1.015 and cpu.costs.largest() <= 8
    weak = policy(costs=PassCosts())
    got = _simulate(weak, 20_000, 0.00195, h200_pass, 0.0018, 0.55, capture_s=0.00002, probe_extra_s=0.02)
    assert weak.costs.largest() <= 9 and got["ratio"] < 1.01  # about the first probe's size: nothing explored


def test_probe_spacing_has_the_probe_steps_own_cost_as_floor():
    """A probe cycle whose capturing steps were measured cheaper than plain ones (the ±5% noise of a
    step on the 2-core CPU: the cycles' sums came out near 0 and the probes came every ~130
    steps, ~1.5% of the time): the probe step's own cost beyond plain decoding (its pass and drafting,
    from the running costs) is the floor of the cycle's cost, and so of the probes' spacing."""
    from tfm_local.decode.step import StepRecord

    auto = policy(costs=PassCosts())
    for _ in range(3):
        auto.observe(_record(0, 0.047, auto, False))
    auto.draft_s = 0.02
    auto.costs.record(8, 0.10)
    auto.costs.record(8, 0.10)
    for _ in range(2):  # two cycles: the first is a warm-up
        for _ in range(32):
            rec = StepRecord(pos=0, budget=0, n_nodes=1, tokens=[1], capture=True)
            rec.phases["verify"] = 0.044  # 3 ms under a plain step: noise
            auto.probes.account(rec, auto.config, auto.costs, auto.draft_s)
        rec = StepRecord(pos=0, budget=7, n_nodes=8, tokens=[1], probe=True, capture=True)
        rec.phases["verify"], rec.phases["drafter"] = 0.10, 0.02
        auto.probes.account(rec, auto.config, auto.costs, auto.draft_s)
    own = 0.10 + 0.02 - 0.047
    assert auto.probes.probe_cost == pytest.approx(own)  # the cycle's sum was 32 x -3 + 73 ms < 0
    assert auto.probes.every >= own / (auto.config.overhead * 0.047) - 1


def test_a_cold_pass_of_a_new_size_does_not_price_that_size_out():
    """An H200 run (HumanEval, 10 prompts): the probe that explored 16 nodes measured
    32 ms (the first pass of a new shape loads its kernels; warm it takes 4.3), that one sample was
    never replaced, and the budget stayed with 8-node probes that did not pay while DDTree@16 ran at
    1.25x plain. A size measured once is measured again before its cost prices anything."""
    run = policy(costs=PassCosts())
    got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.85, capture_s=0.00002, probe_extra_s=0.003,
                    first_probe_extra_s=0.03, cold_pass_s=0.028)
    assert np.mean([b > 0 for b in got["budgets"][1000:]]) > 0.9 and got["ratio"] < 0.6
    assert run.costs.largest() >= 16
    weak = policy(costs=PassCosts())  # where speculation does not pay, re-measuring stays cheap
    got = _simulate(weak, 20_000, 0.00195, h200_pass, 0.0018, 0.55, capture_s=0.00002, probe_extra_s=0.003,
                    first_probe_extra_s=0.03, cold_pass_s=0.028)
    assert got["ratio"] < 1.01


def test_probes_that_pay_come_every_few_generations_and_futile_ones_stay_cheap():
    """H200 costs, 200-token answers to 256-token requests. HumanEval-like: the drafter right 85% of a
    position on a third of the prompts (speculation at 15 runs at ~0.5x plain time there) and 45% on the
    rest. With the futility gate after one probe and a probe's curve weighed 0.2 in the running one, a
    first probe on a hard prompt kept later ones from ever starting speculation; with ``on_gpu``'s
    (``futile_after`` 8, ``curve_probe`` 1, probes at the answers' start) most easy prompts speculate.
    Where the drafter never pays (MT-Bench-like, 45%) decoding stays within 1% of plain's, prefills'
    extra included, also when the requests ask for far more tokens than the answers have."""
    ratios = []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        mixed = [0.85 if rng.random() < 1 / 3 else 0.45 for _ in range(60)]
        ratios.append(_simulate_generations(policy(gpu=True), mixed, seed=seed)["ratio"])
        assert _simulate_generations(policy(gpu=True), [0.45] * 60, seed=seed)["ratio"] < 1.01
        # requests far longer than the answers: a probe pulled to an answer's start moves the next one later
        assert _simulate_generations(policy(gpu=True), [0.85] + [0.45] * 60, max_tokens=1024,
                                     seed=seed)["ratio"] < 1.012
    assert np.mean(ratios) < 0.95 and max(ratios) < 0.99
    old = [_simulate_generations(policy(gpu=True, probe_at_start=False, curve_probe=0.2, futile_after=0),
                                 [0.85 if r < 1 / 3 else 0.45 for r in np.random.default_rng(s).random(60)],
                                 seed=s)["ratio"] for s in range(4)]
    assert np.mean(old) > 0.99  # futile after one probe, a probe's curve at 0.2, no probe at the start
    easy = _simulate_generations(policy(gpu=True), [0.85] * 30)
    assert easy["ratio"] < 0.6


def test_probe_spacing_is_net_of_what_speculation_saved_within_bounds():
    """The spacing floor is the probe cycle's cost net of ``probe_gain``; a gain sample counts between 0
    and ``PROBE_OUTLIER`` cycles' cost (a losing run carried into a harder text pushed the probes out to
    ``probe_cap``, a long winning one lifted the floor for many probes); a running cost that reached 0 takes
    the next sample (capped at twice 0 it stayed 0, and the floor with it)."""
    from tfm_local.decode.budget import PROBE_OUTLIER, running_cost
    from tfm_local.decode.step import StepRecord

    auto = policy(costs=PassCosts())
    auto.observe_plain(0.002)
    auto.probes.probe_cost, auto.probes.n_cycles = 0.02, 2  # 20 ms a cycle: 2,000 steps keep it at 0.5% of 2 ms steps
    assert 1999 <= auto.probes.spacing(8, auto.config, auto.costs) <= 2001
    auto.probes.probe_gain = 0.015
    assert 499 <= auto.probes.spacing(8, auto.config, auto.costs) <= 501
    auto.probes.probe_gain = 0.05
    assert auto.probes.spacing(8, auto.config, auto.costs) == 8
    assert running_cost(0.0, 0.03, 0.2, False) == 0.03

    def run(t_spec: float) -> float:
        a = policy(costs=PassCosts())
        a.observe_plain(0.002)
        a.probes.plain_s, a.probes.probe_cost, a.probes.n_cycles = 0.002, 0.02, 2
        for _ in range(100):  # speculative steps of 2 tokens
            rec = StepRecord(pos=0, budget=3, n_nodes=4, tokens=[1, 2], curve=WEAK)
            rec.phases["verify"] = t_spec
            a.probes.account(rec, a.config, a.costs, a.draft_s)
        probe = StepRecord(pos=0, budget=3, n_nodes=4, tokens=[1], curve=WEAK, probe=True)
        probe.phases["verify"] = 0.006
        a.probes.account(probe, a.config, a.costs, a.draft_s)
        return a.probes.probe_gain, a.probes.probe_cost

    assert run(0.010)[0] == 0.0  # 100 steps that lost 0.6 s: no negative gain
    gain, cost = run(0.001)  # 0.3 s saved: capped at PROBE_OUTLIER cycles (the cycle's cost after this probe)
    assert gain == pytest.approx(0.3 * PROBE_OUTLIER * cost) and PROBE_OUTLIER * cost < 0.3


def test_a_captured_prompt_is_priced_with_the_generations_first_step():
    """What a captured prompt costs (``observe_prompt``: the features' read and the drafter's injection,
    ~10 ms on the H200 against ~3 ms for a probe's own step) goes where the generation's first step
    goes: into the probe cycle when that step is a probe (or a plain step: the cycle's warm-up), against
    what speculation saved when it is a speculative step (a generation that starts speculating on a
    probe's verdict: counted in neither before); nothing (or a non-positive time) changes nothing."""
    from tfm_local.decode.step import StepRecord

    def fresh():
        auto = policy(costs=PassCosts())
        auto.observe_plain(0.002)
        auto.probes.plain_s, auto.draft_s, auto.probes.n_cycles = 0.002, 0.001, 2
        auto.costs.record(8, 0.004)
        auto.costs.record(8, 0.004)
        return auto

    def step(auto, probe, spec=True):
        rec = StepRecord(pos=0, budget=7 if spec else 0, n_nodes=8 if spec else 1, tokens=[1, 1] if spec else [1],
                         curve=WEAK[:7] if spec else None, probe=probe, capture=True)
        rec.phases["verify"], rec.phases["drafter"] = (0.004, 0.001) if spec else (0.002, 0.0)
        auto.observe(rec)

    auto = fresh()
    auto.observe_prompt(0.0)
    auto.observe_prompt(-1.0)
    assert auto.probes.prompt_s == 0.0
    auto.observe_prompt(0.010)
    step(auto, probe=True)
    # the cycle: the prompt's 10 ms and the probe step's 5 ms beyond 2 plain tokens' 4 ms
    assert auto.probes.probe_cost == pytest.approx(0.011) and auto.probes.prompt_s == 0.0
    auto = fresh()
    auto.observe_prompt(0.010)
    step(auto, probe=False)  # speculation from the first step: 4 ms of tokens for 5 ms, and the prompt
    assert auto.probes.earned == pytest.approx(-0.011) and auto.probes.cycle == 0.0
    auto = fresh()
    auto.observe_prompt(0.010)
    step(auto, probe=False, spec=False)  # a capturing plain step first: the prompt opens the cycle
    assert auto.probes.cycle == pytest.approx(0.010) and auto.probes.earned == 0.0


@pytest.mark.parametrize("saved", [0.01, -0.01])
def test_a_speculation_run_that_stops_re_probes_soon_only_if_it_saved_time(saved):
    """When speculation stops paying, the next probe comes after ``probe_min`` steps if the run saved
    time (a few unlucky steps can stop a run that pays) and on the schedule it had if it lost (re-probing
    a losing run soon restarted it over and over: replayed MT-Bench, 0.982 / 0.964x plain against 0.987
    / 0.973x). Either way the run's account starts again from 0."""
    auto = _weak_auto()
    auto._spec, auto.probes.run, auto.probes.every = True, saved, 200
    assert auto.choose(15) == 0
    assert auto.probes.every == (auto.config.probe_min if saved > 0 else 200)
    assert auto.probes.since == 1 and auto.probes.run == 0.0 and not auto._spec


def test_a_speculation_runs_account_counts_its_steps_savings():
    """``_run`` sums, over the speculative (not probe) steps of the run under way, the plain time of the
    tokens they emitted minus their own time."""
    from tfm_local.decode.step import StepRecord

    auto = policy(costs=PassCosts())
    auto.observe_plain(0.002)
    auto.probes.plain_s = 0.002
    for tokens, t, probe in [(3, 0.004, False), (1, 0.004, False), (4, 0.004, True)]:
        rec = StepRecord(pos=0, budget=7, n_nodes=8, tokens=[1] * tokens, curve=WEAK[:7], probe=probe)
        rec.phases["verify"] = t
        auto.observe(rec)
    assert auto.probes.run == pytest.approx((0.006 - 0.004) + (0.002 - 0.004))
