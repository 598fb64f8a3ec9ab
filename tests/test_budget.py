"""The automatic draft budget: cost model, gain curve, choice, probing, and the engine in auto mode."""
from __future__ import annotations

import numpy as np
import pytest

from tfm_local.decode.budget import AutoBudget, PassCosts, best_budget, gain_curve


class LinearCosts(PassCosts):
    """A stated cost model c(n) = a + b·n (seconds) that ignores measurements (a test double)."""

    def __init__(self, a: float, b: float):
        super().__init__()
        self.a, self.b = a, b

    def record(self, n, seconds):
        pass

    def known(self, n):
        return True

    def samples(self, n):
        return 2

    def estimate(self, n):
        out = self.a + self.b * np.asarray(n, dtype=np.float64)
        return float(out) if np.ndim(out) == 0 else out


def test_pass_costs_interpolate_and_extrapolate():
    c = PassCosts(alpha=0.5)
    assert c.estimate(4) is None
    c.record(1, 0.10)
    assert c.estimate(1) == pytest.approx(0.10) and c.estimate(64) == pytest.approx(0.10)
    c.record(5, 0.30)
    assert c.estimate(3) == pytest.approx(0.20)
    assert c.estimate(9) == pytest.approx(0.50)  # slope of the last segment
    c.record(5, 0.50)  # the second sample replaces the first (a first pass may be a cold one)
    assert c.estimate(5) == pytest.approx(0.50)
    c.record(5, 0.30)  # running mean: 0.5·0.50 + 0.5·0.30
    assert c.estimate(5) == pytest.approx(0.40)
    np.testing.assert_allclose(c.estimate(np.array([1, 3])), [0.10, 0.25])
    c.record(0, 1.0)
    c.record(2, -1.0)
    assert not c.known(0) and not c.known(2)


def test_running_costs_forget_a_cold_first_sample_and_cap_outliers():
    """The H200's first 2-token pass took 26.5 ms and its first drafter call 19 ms, against 1.9 and 2.1
    ms after: the second sample replaces the first, and a later outlier counts at most twice the
    mean (a real slowdown still comes through within a few steps)."""
    from tfm_local.decode.budget import OUTLIER, running_cost

    c = PassCosts(alpha=0.3)
    c.record(2, 0.0265)
    c.record(2, 0.0019)
    assert c.estimate(2) == pytest.approx(0.0019)
    c.record(2, 0.1)  # a collection pause
    assert c.estimate(2) == pytest.approx(0.7 * 0.0019 + 0.3 * OUTLIER * 0.0019)
    m = 0.002
    for _ in range(12):  # the machine got 5x slower
        m = running_cost(m, 0.010, 0.3, False)
    assert m == pytest.approx(0.010, rel=0.05)
    assert running_cost(None, 0.5, 0.3, False) == 0.5 and running_cost(0.2, 0.5, 0.3, True) == 0.5


def test_pass_costs_never_fall_with_the_pass_size():
    """A larger pass measured faster (noise) is priced as the smaller one: otherwise that size looks
    like a bargain, the budget bets on it and loses."""
    c = PassCosts()
    c.record(1, 0.2)
    c.record(8, 0.1)
    assert c.estimate(8) == pytest.approx(0.2) and c.estimate(64) == pytest.approx(0.2)
    c.record(2, 0.3)
    c.record(4, 0.25)
    c.record(6, 0.4)
    np.testing.assert_allclose(c.estimate(np.array([1, 2, 3, 4, 5, 6, 8])), [0.2, 0.3, 0.3, 0.3, 0.35, 0.4, 0.4])


def test_gain_curve_is_prefix_sums_of_path_probabilities():
    lp = np.log([0.9, 0.5, 0.3])
    np.testing.assert_allclose(gain_curve(lp, 5), [0.9, 1.4, 1.7, 1.7, 1.7])
    np.testing.assert_allclose(gain_curve(lp, 2), [0.9, 1.4])
    np.testing.assert_allclose(gain_curve(np.zeros(0), 2), [0.0, 0.0])


def test_best_budget_cpu_like_costs_choose_plain_gpu_like_choose_a_tree():
    curve = gain_curve(np.log(np.linspace(0.6, 0.05, 63)), 63)  # about 20 accepted at most
    cpu = LinearCosts(0.035, 0.06)   # a pass costs ~60 ms per token: verification is compute-bound
    gpu = LinearCosts(0.004, 0.00002)
    assert best_budget(cpu, 0.03, curve * 0.05, 1.0, 63) == 0
    b = best_budget(gpu, 0.001, curve, 1.0, 63)
    assert b > 32
    assert best_budget(cpu, 0.03, curve * 0.05, 1.0, 63, speculative_only=True) >= 1
    assert best_budget(gpu, 0.001, curve, 1.0, 0) == 0


def test_best_budget_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(50):
        curve = np.cumsum(rng.uniform(0, 1, 20) ** 3)
        costs, d, r = LinearCosts(rng.uniform(0.01, 0.1), rng.uniform(0, 0.02)), rng.uniform(0, 0.05), 0.7
        rates = [1 / costs.estimate(1) * 1.03] + [(1 + r * curve[b - 1]) / (costs.estimate(b + 1) + d)
                                                  for b in range(1, 21)]
        want = int(np.argmax(rates))
        assert best_budget(costs, d, curve, r, 20) == want


def test_auto_budget_first_plain_then_probe_then_backs_off():
    auto = AutoBudget(costs=LinearCosts(0.035, 0.06), skip_futile=False)  # the schedule alone
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
    auto = AutoBudget(costs=LinearCosts(0.004, 0.00002))
    strong = gain_curve(np.log(np.full(15, 0.9)) * np.arange(1, 16), 15)
    auto.observe_spec(16, 0.005, 0.001, strong, 15, 3)
    a = 1 / (1 + auto.prior_steps)  # the mean with a prior of 1 / 1 worth prior_steps steps
    assert auto.ratio == pytest.approx((1 - a + a * 3) / (1 - a + a * strong[14]))
    assert auto.choose(15) == 15 and not auto.probing
    assert auto.choose(7) == 7


def test_extrapolate_continues_a_short_curve_as_a_chain():
    from tfm_local.decode.budget import extrapolate

    np.testing.assert_allclose(extrapolate([0.8], 4), np.cumsum([0.8, 0.64, 0.512, 0.4096]))
    np.testing.assert_allclose(extrapolate([0.9, 1.7], 4), [0.9, 1.7, 1.7 + 0.8 * 8 / 9, 1.7 + 0.8 * 8 / 9 + 0.8 * (8 / 9) ** 2])
    np.testing.assert_allclose(extrapolate([1.0], 3), [1.0, 1.95, 1.95 + 0.9025])  # rate clamped to 0.95
    np.testing.assert_allclose(extrapolate([0.5, 0.5], 3), [0.5, 0.5, 0.5])         # no gain: stays flat
    assert extrapolate([], 2).tolist() == [0.0, 0.0] and extrapolate([1, 2, 3], 2).tolist() == [1, 2, 3]


def test_a_budget_1_probe_can_show_that_a_deeper_budget_pays():
    """Pass costs of this project's 2-core CPU (66 ms for 1 token, 100 for 2, 112 for 4: fourteenth
    session) and a probe one token deep that the drafter predicts at 0.85: budget 1 alone does not pay
    ((1 + 0.85) / (100 + 20) ms < 1 / 66 ms · 1.03), budget 3 does; a flat continuation of the probe's
    one-point curve hid that, and the engine then never speculated on HumanEval."""
    costs = PassCosts()
    for n, ms in ((1, 66), (2, 100), (3, 106), (4, 112), (8, 202), (16, 253)):
        costs.record(n, ms / 1e3)
    auto = AutoBudget(costs=costs, first_probe=1)
    assert auto.choose(15) == 1 and auto.probing
    auto.observe_spec(2, 0.100, 0.020, np.array([0.85]), 1, 1)
    assert auto.choose(15) >= 3 and not auto.probing


def test_auto_budget_keeps_a_plain_decision_for_recheck_steps(monkeypatch):
    """While plain wins, best_budget runs once per ``recheck`` plain steps (plus the probes); a
    speculative step's statistics make the next choice compute it again."""
    import tfm_local.decode.budget as budget

    calls = []
    real = budget.best_budget
    monkeypatch.setattr(budget, "best_budget", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    auto = AutoBudget(costs=LinearCosts(0.035, 0.06), recheck=4, skip_futile=False)
    weak = gain_curve(np.log(np.full(15, 0.05)) * np.arange(1, 16), 15)
    auto.observe_spec(5, 0.35, 0.03, weak, 4, 0)
    assert [auto.choose(15) for _ in range(8)] == [0] * 8   # the first probe comes after 8 plain steps
    assert len(calls) == 2                      # steps 1 and 5
    strong = gain_curve(np.log(np.full(15, 0.99)) * np.arange(1, 16), 15)
    for _ in range(20):                         # the text turns easy: a spec step's stats arrive
        auto.observe_spec(16, 0.036, 0.001, strong, 15, 15)
    assert auto.choose(15) > 0 and len(calls) == 3


# -- the engine in auto mode ------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tfm_convert.pipeline import init_random
    from tfm_local.testing.synth import write_tiny_target

    d = tmp_path_factory.mktemp("auto")
    target = write_tiny_target(d / "target.gguf", n_layer=4, n_embd=64, seed=3)
    drafter, _ = init_random(target, d / "drafter.gguf", layers=1, seed=4)
    return target, drafter


PROMPT = [{"role": "user", "content": "def hello(): return the answer"}]


class ScriptMarginals:
    """Wraps a drafter: runs its real pass, then returns marginals that put the script's next tokens on top."""

    def __init__(self, inner, prompt_len: int, script: list[int]):
        self.inner, self.prompt_len, self.script = inner, prompt_len, script

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _scripted(self, pos, n_draft):
        m = np.zeros((n_draft, self.inner.target.model.n_vocab), dtype=np.float32)
        for i in range(n_draft):
            j = pos - self.prompt_len + 1 + i
            m[i, self.script[j] if 0 <= j < len(self.script) else 0] = 12.0
        return m

    def marginals(self, last_token, pos, n_draft):
        self.inner.marginals(last_token, pos, n_draft)
        return self._scripted(pos, n_draft)

    def top_k(self, last_token, pos, n_draft, k):
        """The engine drafts from top_k: the real (backend) pass, then the script's top-k."""
        from tfm_local.decode.draft import top_k_logprobs

        self.inner.top_k(last_token, pos, n_draft, k)
        return top_k_logprobs(self._scripted(pos, n_draft), k)


@pytest.mark.parametrize("tree", ["chain", "ddtree"])
def test_engine_auto_lossless_and_follows_the_cost_model(pair, tree):
    from tfm_local.engine import Engine

    target, drafter = pair
    with Engine(target, None, n_ctx=512) as plain, Engine(target, drafter, n_ctx=512, tree=tree) as e:
        ids = plain.prompt_tokens(PROMPT)
        ref = list(plain.generate_ids(ids, 60, plain_sp()))
        assert e.auto is not None
        fixed_draft_time(e.auto, 0.03)
        e.auto.costs = LinearCosts(0.035, 0.06)  # CPU-like: the random drafter never pays
        assert list(e.generate_ids(ids, 60, plain_sp())) == ref
        assert e.stats.n_spec_steps <= 3 and e.stats.n_steps >= 50
        real = e.drafter
        e.drafter = ScriptMarginals(real, len(ids), ref)
        try:
            e.auto.costs = LinearCosts(0.004, 0.00002)  # GPU-like, and drafts that are always right
            fixed_draft_time(e.auto, 0.001)
            e.auto.accepted = e.auto.predicted = 0.0
            e.auto._since_probe = e.auto._probe_every  # the probes are far apart now (their cost): one is due
            assert list(e.generate_ids(ids, 60, plain_sp())) == ref
        finally:
            e.drafter = real
        assert e.stats.n_spec_steps >= e.stats.n_steps - 3 and e.stats.tau > 4


def fixed_draft_time(auto: AutoBudget, seconds: float) -> None:
    """Make the chooser see a stated drafting time (measured times vary with the machine's load)."""
    real = auto.observe_spec

    def observe(n_nodes, verify_s, draft_s, curve, budget, accepted, record=True, probe=False):
        real(n_nodes, verify_s, seconds, curve, budget, accepted, record=record, probe=probe)
        auto.draft_s = seconds

    auto.observe_spec = observe


def plain_sp():
    from tfm_local.decode.sampling import SamplingParams

    return SamplingParams()


def test_set_budget_auto_keeps_measurements_and_rejects_other_strings(pair):
    from tfm_local.engine import Engine

    target, drafter = pair
    with Engine(target, drafter, n_ctx=128) as e:
        state = e.auto
        e.set_budget(0)
        assert e.auto is None and e.active_drafter is None
        e.set_budget("auto")
        assert e.auto is state and e.budget == e.drafter.block_size - 1
        e.set_draft("ddtree", "auto")
        assert e.auto is not state and e.auto.costs is state.costs  # own statistics, shared pass costs
        e.set_draft("chain", "auto")
        assert e.auto is state
        with pytest.raises(ValueError, match="auto"):
            e.set_budget("fast")
    with Engine(target, None, n_ctx=128) as p:
        assert p.auto is None and p.budget == 0


# -- plain stretches without capture, and probes spaced by their cost ----------------------

WEAK = gain_curve(np.log(np.full(15, 0.05)) * np.arange(1, 16), 15)


def _weak_auto(**kw) -> AutoBudget:
    """An AutoBudget past its first probe on CPU-like costs with a weak drafter: plain decoding wins.
    Its probes follow the schedule (``skip_futile`` False unless given: they would all be futile)."""
    kw.setdefault("skip_futile", False)
    auto = AutoBudget(costs=LinearCosts(0.035, 0.06), **kw)
    auto.observe_spec(5, 0.35, 0.03, WEAK, 4, 0)
    return auto


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
    auto.curve = gain_curve(np.log(np.full(15, 0.9)) * np.arange(1, 16), 15)
    auto.draft_s, auto.accepted, auto.predicted, auto._plain_kept = 0.001, 0.0, 0.0, 0
    got = [(auto.choose(15), auto.capture) for _ in range(6)]
    assert got[:5] == [(0, True)] * 5 and got[5][0] > 0 and got[5][1] and not auto.probing
    assert auto.plan(64, 15)  # speculation pays: the next prefill captures
    auto.begin(True)
    assert auto.choose(15) > 0


def test_plan_captures_the_prompt_only_when_the_generation_can_draft():
    auto = AutoBudget(costs=LinearCosts(0.035, 0.06))
    assert auto.plan(8, 15)  # nothing known yet: the first probe comes at once
    auto = _weak_auto(probe_min=100)
    assert not auto.plan(64, 15) and auto.plan(128, 15)
    auto.begin(False)
    assert not auto.capture and auto._covered == 0
    gpu = _weak_auto(probe_min=100, probe_at_start=True)  # on a GPU the probe comes at the first step
    assert gpu.plan(128, 15)
    gpu.begin(True)
    assert gpu.choose(15) > 0 and gpu.probing


def _probe_gaps(auto: AutoBudget, steps: int, curve) -> tuple[list[int], int]:
    """Plain steps between the probes of ``steps`` choices (each probe observed with ``curve`` and no
    token accepted), and the plain steps that captured."""
    gaps, since, captured = [], 0, 0
    for _ in range(steps):
        b = auto.choose(15)
        since += 1
        captured += bool(auto.capture and not b)
        if b:
            gaps.append(since)
            since = 0
            auto.observe_spec(b + 1, 0.1, 0.03, curve, b, 0)
    return gaps, captured


def test_probes_that_cannot_lead_to_speculation_are_skipped():
    """CPU-like costs and a weak drafter (5% a position): no budget could pay even at the best curve
    seen with passes no dearer than one token, so the due probes are skipped (no warm-up either), the
    gap doubling up to ``probe_cap``, where the drafter is probed whatever the bound says. A strong
    curve seen once keeps the probes on their schedule; so does ``skip_futile=False``."""
    auto = AutoBudget(costs=LinearCosts(0.035, 0.06), probe_cap=1024)
    auto.observe_spec(5, 0.35, 0.03, WEAK, 4, 0)
    assert auto.futile(15)
    gpu = AutoBudget(costs=LinearCosts(0.035, 0.06), probe_cap=1024, futile_after=8)  # ``on_gpu``'s
    gpu.observe_spec(5, 0.35, 0.03, WEAK, 4, 0)
    assert not gpu.futile(15)  # not before ``futile_after`` probe cycles
    gpu._n_cycles = 8
    assert gpu.futile(15)
    gaps, captured = _probe_gaps(auto, 6000, WEAK)
    assert 2 <= len(gaps) <= 6 and min(gaps) >= 1024
    assert captured <= len(gaps) * auto.window  # capture only before the probes made
    assert not auto.plan(2000, 15) or auto._probe_every >= auto.probe_cap  # no prompt capture for a skipped probe

    sched = AutoBudget(costs=LinearCosts(0.035, 0.06), probe_cap=1024, skip_futile=False)
    sched.observe_spec(5, 0.35, 0.03, WEAK, 4, 0)
    assert len(_probe_gaps(sched, 6000, WEAK)[0]) >= 20

    once = AutoBudget(costs=LinearCosts(0.035, 0.06), probe_cap=1024)
    once.observe_spec(16, 0.35, 0.03, gain_curve(np.log(np.full(15, 0.99)) * np.arange(1, 16), 15), 15, 0)
    assert not once.futile(15)  # the best curve seen could pay: the text may turn easy again
    assert len(_probe_gaps(once, 6000, WEAK)[0]) >= 20


def _record(k: int, seconds: float, auto: AutoBudget, switched: bool, curve=WEAK):
    from tfm_local.decode.step import StepRecord

    rec = StepRecord(pos=0, budget=k, n_nodes=k + 1, tokens=[1], curve=curve if k else None,
                     probe=k > 0 and auto.probing, capture=auto.capture, switched=switched)
    rec.phases["verify"] = seconds
    return rec


def test_probes_are_spaced_by_their_measured_cost():
    """Plain steps of 30 ms, a probe 90 ms (no token gained), a capturing step 1 ms more, a capture
    switch 10 ms: the probe cycle's cost sets the gap between probes so that probing stays within
    ``overhead`` (0.5%) of plain decoding, and probes still come (the doubling alone probed every 256
    steps: 3% here)."""
    auto = AutoBudget(costs=PassCosts(), skip_futile=False)
    total, probes, was = 0.0, 0, True
    n = 30_000
    for _ in range(n):
        k = auto.choose(15)
        switched, was = auto.capture != was, auto.capture
        t = (0.09 if k else 0.03 + 0.001 * auto.capture) + 0.01 * switched
        probes += k > 0
        total += t
        auto.observe(_record(k, t, auto, switched))
    assert auto.probe_cost == pytest.approx(0.06 + 0.02 + 32 * 0.001, rel=0.05)
    assert auto._probe_every >= auto.probe_cost / (auto.overhead * 0.03)
    assert total / (n * 0.03) - 1 < auto.overhead + 0.002
    assert probes >= 20


def test_probe_spacing_is_capped():
    auto = AutoBudget(costs=PassCosts(), probe_cap=500)
    auto.observe_plain(0.03)
    auto.probe_cost, auto._n_cycles = 10.0, 2  # a probe as dear as 333 plain steps: the 1% floor would be 33,333
    assert auto._spacing(8) == 500


def test_a_warm_up_runs_its_course():
    """A decision near the margin must not switch the capture on and off: once a warm-up has begun it
    captures ``window`` steps, and only then is the choice made again."""
    auto = _weak_auto(probe_min=100, window=5)
    for _ in range(10):
        auto.choose(15)
    cpu, auto.costs = auto.costs, LinearCosts(0.004, 0.00002)
    auto.curve = gain_curve(np.log(np.full(15, 0.9)) * np.arange(1, 16), 15)
    auto.draft_s, auto.accepted, auto.predicted, auto._plain_kept = 0.001, 0.0, 0.0, 0
    assert (auto.choose(15), auto.capture) == (0, True)
    auto.costs, auto.curve = cpu, WEAK  # plain wins again
    assert [(auto.choose(15), auto.capture) for _ in range(4)] == [(0, True)] * 4
    assert (auto.choose(15), auto.capture) == (0, False)


def test_many_short_generations_cost_what_plain_decoding_costs():
    """Generations of 160 tokens (asked for 256) while speculation loses: plain steps of 1.9 ms, a
    capturing step 0.02 ms more, a capture switch 0.3 ms (a graph rebuild), a probe 5.5 ms for one
    token. Across generations the probes keep their spacing and decoding costs at most ~1% more than
    plain."""
    auto = AutoBudget(costs=PassCosts(), skip_futile=False)
    state, total, plain, probes = True, 0.0, 0.0, 0
    n_gen, length = 200, 160
    for _ in range(n_gen):
        cap = auto.plan(256, 15)
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


def test_a_cold_start_and_a_missed_first_probe_do_not_price_speculation_out():
    """H200-like costs where speculation pays (a 1-token pass 1.9 ms, n tokens 1.9 + 0.15·n ms, drafting
    2 ms, a drafter right 85% of the time per position), with the first pass of every size 10x slower
    (CUDA graph capture), the first drafting 19 ms, and the first probe missing its one token: the
    budget still turns to speculation within a few hundred steps and stays there. Before, the cold
    costs were averaged in and the missed probe set the calibration to its floor (0.02): the engine
    decoded plainly through a whole HumanEval run where DDTree@16 ran at 1.16x plain."""
    auto = AutoBudget(costs=PassCosts())
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


def _drive(auto: AutoBudget, n: int, use_stretch: bool, t: float = 0.03) -> list[tuple[int, bool]]:
    """``n`` steps of plain decoding's cost ``t`` (probes 3t, no token gained) under ``auto``: each step
    chosen and observed, or, with ``use_stretch``, the steps of each ``stretch`` reported together as
    the engine does. Returns (budget, capture) per step, (0, False) for a stretch's steps."""
    got, i = [], 0
    while i < n:
        k = auto.choose(15)
        got.append((k, auto.capture))
        auto.observe(_record(k, 3 * t if k else t, auto, False))
        i += 1
        j = min(auto.stretch(), n - i) if use_stretch else 0
        if j:
            auto.observe_stretch(j, j * t, j * t)
            got += [(0, False)] * j
            i += j
    return got


def test_a_stretch_moves_the_state_as_its_steps_would():
    """The steps ``stretch`` promises are the plain steps without capture that step-by-step choices
    make, and ``observe_stretch`` leaves the chooser where those steps would have: the same choices
    (probes, warm-ups) follow, while the per-step budget work runs once per stretch."""
    a, b = _weak_auto(probe_min=300, window=8), _weak_auto(probe_min=300, window=8)
    stretched = []
    real = b.observe_stretch
    b.observe_stretch = lambda n, v, s: stretched.append(n) or real(n, v, s)
    assert _drive(a, 2000, False) == _drive(b, 2000, True)
    assert sum(stretched) > 1500 and max(stretched) == b.recheck - 1
    for name in ("_since_probe", "_probe_every", "_plain_kept", "_covered", "capture", "probing"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.plain_s == pytest.approx(b.plain_s)


def test_no_stretch_while_capturing_probing_or_before_statistics():
    auto = AutoBudget(costs=LinearCosts(0.035, 0.06))
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


def test_engine_reports_a_stretch_cut_short(pair):
    """The engine runs a stretch's steps as plain decoding's own and reports them to the budget, also
    when the generation (or its consumer) stops inside one: every step is accounted for."""
    from tfm_local.engine import Engine

    target, drafter = pair
    with Engine(target, drafter, n_ctx=512) as e:
        ids = e.prompt_tokens(PROMPT)
        e.auto.costs = LinearCosts(0.035, 0.06)
        fixed_draft_time(e.auto, 0.03)
        list(e.generate_ids(ids, 40, plain_sp()))  # past the first probe: plain wins from here
        seen = {"stretch": 0, "single": 0}
        real_stretch, real_observe = e.auto.observe_stretch, e.auto.observe
        e.auto.observe_stretch = lambda n, v, s: seen.__setitem__("stretch", seen["stretch"] + n) or real_stretch(n, v, s)
        e.auto.observe = lambda rec: seen.__setitem__("single", seen["single"] + 1) or real_observe(rec)
        e.auto._probe_every = 10_000  # no probe near: only the recheck (32) bounds a stretch
        before = e.auto._since_probe
        gen = e.generate_ids(ids, 200, plain_sp())
        out = [next(gen) for _ in range(50)]
        gen.close()
        assert len(out) == 50
        steps = e.stats.n_steps
        # 49 decode steps (the prefill gave the first token): a decided step, a stretch of 31, a decided
        # step, and 16 steps of the next stretch when the consumer stopped
        assert steps == 49 and (seen["single"], seen["stretch"]) == (2, 47)
        assert e.auto._since_probe - before == steps


def _simulate(auto: AutoBudget, n_steps: int, plain_s: float, pass_s, draft_s: float, p_accept: float,
              capture_s: float = 0.0, probe_extra_s: float = 0.0, seed: int = 0, k_cap: int = 15,
              first_probe_extra_s: float | None = None, cold_pass_s: float = 0.0,
              switch_pass_s: float = 0.0, warm: tuple = ()) -> dict:
    """Drive ``auto`` through ``n_steps`` steps of a chain drafter whose every position is right with
    probability ``p_accept``, on a machine where a plain step costs ``plain_s``, a verification of n
    nodes ``pass_s(n)``, drafting ``draft_s``, a capturing plain step ``capture_s`` more and a probe
    ``probe_extra_s`` more outside its pass and drafting (a probe cycle measured 27.7 ms on the H200
    against ~5 ms from its parts; a batched injection's time is such a part), the first probe
    ``first_probe_extra_s`` (default the same: a cold first cycle is dearer), and the first pass of
    each size ``cold_pass_s`` more (a GPU loads the kernels of a new shape), and a pass whose size
    differs from either of the two passes before it ``switch_pass_s`` more (upstream ggml-cuda's one
    CUDA graph per context: the first pass of another shape runs kernel by kernel, the second captures).
    ``warm``: pass sizes whose costs are recorded twice first (the engine's warm-up at load). Returns the
    time against plain decoding's for the same tokens, the budgets chosen and the probes."""
    rng = np.random.default_rng(seed)
    for n in warm:
        for _ in range(2):
            auto.costs.record(n, plain_s if n == 1 else pass_s(n))
    last2 = [0, 0]
    curve = gain_curve(np.log(np.full(k_cap, p_accept)) * np.arange(1, k_cap + 1), k_cap)
    total = tokens = 0.0
    budgets, probes, seen = [], 0, set()
    for _ in range(n_steps):
        k = auto.choose(k_cap)
        probing = auto.probing
        extra = probe_extra_s if first_probe_extra_s is None or probes else first_probe_extra_s
        if k:
            hits = rng.random(k) < p_accept
            accepted = int(np.argmin(hits)) if not hits.all() else k
            t_verify, t_draft = pass_s(k + 1) + cold_pass_s * (k + 1 not in seen), draft_s + extra * probing
            seen.add(k + 1)
        else:
            accepted, t_verify, t_draft = 0, plain_s + capture_s * auto.capture, 0.0
        t_verify += switch_pass_s * (k + 1 != last2[0] or last2[0] != last2[1])
        last2 = [k + 1, last2[0]]
        from tfm_local.decode.step import StepRecord

        rec = StepRecord(pos=0, budget=k, n_nodes=k + 1, tokens=[1] * (accepted + 1),
                         curve=(curve[:k] if probing else curve) if k else None, probe=k > 0 and probing,
                         capture=auto.capture)
        rec.phases["verify"], rec.phases["drafter"] = t_verify, t_draft
        rec.t_sync = extra * (k > 0 and probing)  # the cycle's extra: not drafting, not the pass
        auto.observe(rec)
        total += t_verify + t_draft
        tokens += accepted + 1
        budgets.append(k)
        probes += k > 0 and probing
    return dict(ratio=total / (tokens * plain_s), budgets=budgets, probes=probes, tokens=tokens)


def h200_pass(n: int) -> float:
    """The H200's default-pair verification as measured: a 2-node probe pass 4.0 ms, a
    17-node one 4.3, a 65-node one 7.2 (capture and per-row reads included)."""
    return float(np.interp(n, [2, 17, 65], [0.0040, 0.0043, 0.0072]))


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

    auto = AutoBudget(costs=PassCosts())
    auto.observe_plain(0.00195)
    twice(auto, 2, 0.0040, 0.0018, gain_curve(np.log([0.85]), 1), 1, 1)
    assert auto.exploration(15) == 3  # the first probe's 2-node pass: explore 4 nodes
    twice(auto, 4, 0.00402, 0.0018, gain_curve(np.log(np.full(3, 0.85)) * np.arange(1, 4), 3), 3, 2)
    assert auto.exploration(15) == 7 and auto.exploration(5) == 5
    cpu = AutoBudget(costs=PassCosts())  # passes linear in their size: no exploration past 4 nodes
    cpu.observe_plain(0.035)
    twice(cpu, 2, 0.070, 0.05, gain_curve(np.log([0.85]), 1), 1, 1)
    twice(cpu, 4, 0.140, 0.05, gain_curve(np.log(np.full(3, 0.85)) * np.arange(1, 4), 3), 3, 2)
    assert cpu.exploration(15) == 7  # were passes beyond 4 nodes no dearer, 16 would pay: one more look
    twice(cpu, 8, 0.280, 0.05, gain_curve(np.log(np.full(7, 0.85)) * np.arange(1, 8), 7), 7, 4)
    assert cpu.exploration(15) == 0

    run = AutoBudget(costs=PassCosts())
    got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.85, capture_s=0.00002, probe_extra_s=0.02)
    late = got["budgets"][-1000:]
    assert np.mean([b > 0 for b in late]) > 0.9 and np.median(late) >= 8
    assert got["ratio"] < 0.6  # ~1.7x faster than plain decoding over the run, probes included
    assert run.costs.largest() >= 16


def test_a_cold_first_probe_cycle_does_not_space_the_probes_out():
    """An H200 run (docs/notebook/gpu.md): the first probe cycle of a process is cold (the drafter's first
    pass, CUDA graphs of new shapes: 27.7 ms beyond its parts' ~5 ms), and its cost set
    the gap to the next probe at ~2,900 steps (0.5% of plain time), so on HumanEval the budget made
    2-3 probes in 6,000 tokens and never speculated where DDTree@16 ran at 1.21x plain. The first
    cycle is a warm-up: its cost does not space the probes; the second cycle's replaces it."""
    run = AutoBudget(costs=PassCosts())
    got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.85, capture_s=0.00002, probe_extra_s=0.003,
                    first_probe_extra_s=0.03)
    assert np.mean([b > 0 for b in got["budgets"][500:]]) > 0.9 and got["ratio"] < 0.6  # within 500 steps
    weak = AutoBudget(costs=PassCosts())  # and where speculation does not pay, probing stays cheap
    got = _simulate(weak, 20_000, 0.00195, h200_pass, 0.0018, 0.55, capture_s=0.00002, probe_extra_s=0.003,
                    first_probe_extra_s=0.03)
    assert got["ratio"] < 1.008


def test_exploration_stops_where_passes_grow_with_their_size():
    """CPU-like costs (every pass linear in its size: 35 ms a node, drafting 50 ms) with the same
    drafter: exploration measures a pass or two, finds them dear and stops; over 30,000 steps the
    engine costs at most 1.5% more than plain decoding. And where the drafter is weak on the GPU
    (MT-Bench-like, 55% a position) speculation never pays and nothing is explored."""
    cpu = AutoBudget(costs=PassCosts())
    got = _simulate(cpu, 30_000, 0.035, lambda n: 0.035 * n, 0.05, 0.85, capture_s=0.0005, probe_extra_s=0.05)
    assert got["ratio"] < 1.015 and cpu.costs.largest() <= 8
    weak = AutoBudget(costs=PassCosts())
    got = _simulate(weak, 20_000, 0.00195, h200_pass, 0.0018, 0.55, capture_s=0.00002, probe_extra_s=0.02)
    assert weak.costs.largest() <= 9 and got["ratio"] < 1.01  # about the first probe's size: nothing explored


def test_probe_spacing_has_the_probe_steps_own_cost_as_floor():
    """A probe cycle whose capturing steps were measured cheaper than plain ones (the ±5% noise of a
    step on the 2-core CPU: in one run the cycles' sums came out near 0 and the probes came every ~130
    steps, ~1.5% of the time): the probe step's own cost beyond plain decoding (its pass and drafting,
    from the running costs) is the floor of the cycle's cost, and so of the probes' spacing."""
    from tfm_local.decode.step import StepRecord

    auto = AutoBudget(costs=PassCosts())
    for _ in range(3):
        auto.observe(_record(0, 0.047, auto, False))
    auto.draft_s = 0.02
    auto.costs.record(8, 0.10)
    auto.costs.record(8, 0.10)
    for _ in range(2):  # two cycles: the first is a warm-up
        for _ in range(32):
            rec = StepRecord(pos=0, budget=0, n_nodes=1, tokens=[1], capture=True)
            rec.phases["verify"] = 0.044  # 3 ms under a plain step: noise
            auto._account(rec)
        rec = StepRecord(pos=0, budget=7, n_nodes=8, tokens=[1], probe=True, capture=True)
        rec.phases["verify"], rec.phases["drafter"] = 0.10, 0.02
        auto._account(rec)
    own = 0.10 + 0.02 - 0.047
    assert auto.probe_cost == pytest.approx(own)  # the cycle's sum was 32 x -3 + 73 ms < 0
    assert auto._probe_every >= own / (auto.overhead * 0.047) - 1


def test_a_cold_pass_of_a_new_size_does_not_price_that_size_out():
    """An H200 run (HumanEval, 10 prompts; docs/notebook/gpu.md): the probe that explored 16 nodes measured
    32 ms (the first pass of a new shape loads its kernels; warm it takes 4.3), that one sample was
    never replaced, and the budget stayed with 8-node probes that did not pay while DDTree@16 ran at
    1.25x plain. A size measured once is measured again before its cost prices anything."""
    run = AutoBudget(costs=PassCosts())
    got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.85, capture_s=0.00002, probe_extra_s=0.003,
                    first_probe_extra_s=0.03, cold_pass_s=0.028)
    assert np.mean([b > 0 for b in got["budgets"][1000:]]) > 0.9 and got["ratio"] < 0.6
    assert run.costs.largest() >= 16
    weak = AutoBudget(costs=PassCosts())  # where speculation does not pay, re-measuring stays cheap
    got = _simulate(weak, 20_000, 0.00195, h200_pass, 0.0018, 0.55, capture_s=0.00002, probe_extra_s=0.003,
                    first_probe_extra_s=0.03, cold_pass_s=0.028)
    assert got["ratio"] < 1.01


def test_speculation_that_pays_is_not_stopped_by_the_ratios_noise():
    """A drafter right 75% of the time on H200-like costs: speculation at 15 runs at ~0.81x plain time.
    One threshold for starting and stopping, with the accepted/predicted ratio at weight 0.05, let its
    noise stop speculation every ~200 steps, and probes 256 steps apart restarted it after ~1,000:
    0.96x plain time over 6,000 steps (simulated, four seeds). Speculation under way now goes on while
    predicted at ``keep`` (0.97x) of plain decoding or better."""
    ratios = []
    for seed in range(4):
        run = AutoBudget(costs=PassCosts())
        got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.75, capture_s=0.00002, probe_extra_s=0.003,
                        first_probe_extra_s=0.03, cold_pass_s=0.028, seed=seed)
        ratios.append(got["ratio"])
    assert np.mean(ratios) < 0.92


def test_on_a_gpu_the_budget_keeps_few_pass_shapes():
    """H200 (docs/notebook/gpu.md): with every size allowed the budget moved by one node a step (16,
    15, 14, … 5 on HumanEval); upstream ggml-cuda keeps one CUDA graph per context, so each pass of a new
    size ran kernel by kernel (a speculative step 8.2 ms against DDTree@16's steady 6.6), that cost priced
    its size out, the next size down was tried, and the budget stopped speculating where DDTree@16 ran at
    1.2x plain. Simulated with the same penalty (4 ms on the first two passes of a size after another)
    and the warm-up's costs: every size allowed, a HumanEval-like drafter ends in plain decoding; with
    ``AutoBudget.on_gpu`` (passes of ``GPU_SIZES`` nodes, a size kept within 3% of the best, costs of
    steady passes only) it speculates at 15 and runs at ~0.5x plain time."""
    kw = dict(capture_s=0.00002, probe_extra_s=0.003, switch_pass_s=0.004)
    every = AutoBudget(costs=PassCosts())
    got = _simulate(every, 6000, 0.00195, h200_pass, 0.0018, 0.85, warm=tuple(range(1, 17)), seed=0, **kw)
    assert got["ratio"] > 0.98 and len(set(got["budgets"])) > 5
    for seed in range(3):
        gpu = AutoBudget.on_gpu()
        got = _simulate(gpu, 6000, 0.00195, h200_pass, 0.0018, 0.85, warm=(1, 2, 4, 8, 16), seed=seed, **kw)
        assert set(got["budgets"]) <= {0, 1, 3, 7, 15}
        assert got["ratio"] < 0.55 and np.mean([b > 0 for b in got["budgets"][500:]]) > 0.95
    weak = AutoBudget.on_gpu()  # and where speculation does not pay, it stays within 0.5% of plain
    got = _simulate(weak, 20_000, 0.00195, h200_pass, 0.0018, 0.55, warm=(1, 2, 4, 8, 16), **kw)
    assert got["ratio"] < 1.005


def test_gpu_budgets_are_the_sizes_allowed_and_costs_come_from_steady_passes():
    """``AutoBudget.budgets`` / ``fit`` on ``GPU_SIZES`` (node counts 2, 4, 8, …: budgets 1, 3, 7, …),
    every size on the CPU; with ``steady_costs`` a pass's cost is recorded from the third pass in a row
    of its size (the first two after another shape run without a replayed CUDA graph)."""
    from tfm_local.decode.budget import GPU_SIZES
    from tfm_local.decode.step import StepRecord

    gpu, cpu = AutoBudget.on_gpu(), AutoBudget()
    assert gpu.sizes == GPU_SIZES and list(gpu.budgets(15)) == [1, 3, 7, 15]
    assert list(gpu.budgets(10)) == [1, 3, 7] and list(gpu.budgets(0)) == []
    assert list(cpu.budgets(4)) == [1, 2, 3, 4]
    assert (gpu.fit(12, 63), gpu.fit(7, 63), gpu.fit(2, 63), gpu.fit(0, 63), gpu.fit(40, 20)) == (7, 7, 1, 0, 15)
    assert cpu.fit(12, 63) == 12
    passes = [(8, 0.010), (8, 0.010), (8, 0.004), (8, 0.004), (1, 0.006), (1, 0.006), (1, 0.002)]
    for n, t in passes:
        rec = StepRecord(pos=0, budget=n - 1, n_nodes=n, tokens=[1], capture=True,
                         curve=gain_curve(np.log(np.full(n - 1, 0.8)) * np.arange(1, n), n - 1) if n > 1 else None)
        rec.phases["verify"], rec.phases["drafter"] = t, 0.001 * (n > 1)
        gpu.observe(rec)
    assert gpu.costs.samples(8) == 2 and gpu.costs.estimate(8) == pytest.approx(0.004)
    assert gpu.costs.samples(1) == 1 and gpu.costs.estimate(1) == pytest.approx(0.002)


@pytest.mark.parametrize("tree", ["chain", "ddtree"])
def test_engine_gpu_budget_verifies_passes_of_the_allowed_sizes_only(pair, tree):
    """The engine with ``AutoBudget.on_gpu`` (what it takes on a GPU), drafts that are always right and
    GPU-like costs: lossless, speculating, and every verification pass has one of ``GPU_SIZES`` nodes
    (or one token), also in the last steps of a generation where fewer tokens are wanted."""
    from tfm_local.decode.budget import GPU_SIZES
    from tfm_local.engine import Engine

    target, drafter = pair
    with Engine(target, None, n_ctx=512) as plain, Engine(target, drafter, n_ctx=512, tree=tree) as e:
        ids = plain.prompt_tokens(PROMPT)
        ref = list(plain.generate_ids(ids, 45, plain_sp()))
        e._auto_states[tree] = e.auto = AutoBudget.on_gpu(costs=LinearCosts(0.004, 0.00002))
        fixed_draft_time(e.auto, 0.001)
        sizes, observe = [], e.auto.observe

        def record(rec):
            sizes.append(rec.n_nodes)
            observe(rec)

        e.auto.observe = record
        real = e.drafter
        e.drafter = ScriptMarginals(real, len(ids), ref)
        try:
            assert list(e.generate_ids(ids, 45, plain_sp())) == ref
        finally:
            e.drafter = real
        assert e.stats.n_spec_steps >= 3 and e.stats.tau > 3
        assert set(sizes) <= {1, *GPU_SIZES} and len(set(sizes) - {1}) >= 1, sizes


def test_an_unlucky_start_or_probe_does_not_end_speculation_for_good():
    """A drafter right 75% of a position on H200 costs (speculation at 15 runs at ~0.81x plain time): with
    the calibration's prior worth one step and probes at the running weight (0.03), a few unlucky first
    steps sent r to ~0.7 and speculation stopped; the probes, hundreds of steps apart, each moved r by 3%
    and it stayed plain for the rest of the run in 2 of 8 seeds. With the prior worth 4 steps and probes
    weighed at least 0.3 every seed speculates."""
    ratios = []
    for seed in range(8):
        run = AutoBudget.on_gpu()
        got = _simulate(run, 6000, 0.00195, h200_pass, 0.0018, 0.75, capture_s=0.00002, probe_extra_s=0.003,
                        warm=(1, 2, 4, 8, 16), seed=seed)
        ratios.append(got["ratio"])
    assert max(ratios) < 0.97 and np.mean(ratios) < 0.87
    old = [_simulate(AutoBudget.on_gpu(prior_steps=1, alpha_probe=None), 6000, 0.00195, h200_pass, 0.0018,
                     0.75, capture_s=0.00002, probe_extra_s=0.003, warm=(1, 2, 4, 8, 16), seed=s)["ratio"]
           for s in range(8)]
    assert max(old) > 1.0 and np.mean(old) > 0.88


def _simulate_generations(auto: AutoBudget, kinds: list[float], length: int = 200, max_tokens: int = 256,
                          seed: int = 0, plain_s: float = 0.00195, draft_s: float = 0.0018,
                          capture_s: float = 0.00035, switch_s: float = 0.0015, probe_extra_s: float = 0.003,
                          prompt_s: float = 0.004) -> dict:
    """Generations of ``length`` tokens (``max_tokens`` asked for: the end-of-generation token comes first),
    one per entry of ``kinds`` (the probability that the drafter is right at a position on that prompt),
    on H200-like costs as measured (docs/notebook/gpu.md): a plain step ``plain_s``, a capturing
    one ``capture_s`` more, a capture switch ``switch_s``, a probe ``probe_extra_s`` beyond its pass and
    drafting, a captured prompt ``prompt_s`` more in its prefill. Returns the time against plain
    decoding's for the same tokens (prefills' extra included) and the generations that speculated."""
    rng = np.random.default_rng(seed)
    from tfm_local.decode.step import StepRecord

    for n in (1, 2, 4, 8, 16):
        for _ in range(2):
            auto.costs.record(n, plain_s if n == 1 else h200_pass(n))
    total, tokens, capture, spec_gens = 0.0, 0, True, 0
    for p in kinds:
        curve = gain_curve(np.log(np.full(15, p)) * np.arange(1, 16), 15)
        cap = auto.plan(max_tokens, 15)
        total += prompt_s * cap + switch_s * (cap != capture)
        capture = cap
        auto.begin(cap)
        if cap:
            auto.observe_prompt(prompt_s)
        emitted, spec = 1, False
        while emitted < length:
            k = auto.choose(15, max_tokens - emitted)
            probing = auto.probing
            t = switch_s * (auto.capture != capture)
            capture = auto.capture
            if k:
                hits = rng.random(k) < p
                acc = min(int(np.argmin(hits)) if not hits.all() else k, length - emitted - 1)
                t_verify, t_draft = h200_pass(k + 1), draft_s + probe_extra_s * probing
                spec |= not probing
            else:
                acc, t_verify, t_draft = 0, plain_s + capture_s * capture, 0.0
            rec = StepRecord(pos=0, budget=k, n_nodes=k + 1, tokens=[1] * (acc + 1), probe=k > 0 and probing,
                             curve=(curve[:k] if probing else curve) if k else None, capture=capture)
            rec.phases["verify"], rec.phases["drafter"] = t_verify + t, t_draft
            rec.t_sync = probe_extra_s * (k > 0 and probing)
            auto.observe(rec)
            total += t_verify + t_draft + t
            emitted += acc + 1
        tokens += emitted - 1
        spec_gens += spec
    return dict(ratio=total / (tokens * plain_s), spec_gens=spec_gens)


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
        ratios.append(_simulate_generations(AutoBudget.on_gpu(), mixed, seed=seed)["ratio"])
        assert _simulate_generations(AutoBudget.on_gpu(), [0.45] * 60, seed=seed)["ratio"] < 1.01
        # requests far longer than the answers: a probe pulled to an answer's start moves the next one later
        assert _simulate_generations(AutoBudget.on_gpu(), [0.85] + [0.45] * 60, max_tokens=1024,
                                     seed=seed)["ratio"] < 1.012
    assert np.mean(ratios) < 0.95 and max(ratios) < 0.99
    old = [_simulate_generations(AutoBudget.on_gpu(probe_at_start=False, curve_probe=0.2, futile_after=0),
                                 [0.85 if r < 1 / 3 else 0.45 for r in np.random.default_rng(s).random(60)],
                                 seed=s)["ratio"] for s in range(4)]
    assert np.mean(old) > 0.99  # futile after one probe, a probe's curve at 0.2, no probe at the start
    easy = _simulate_generations(AutoBudget.on_gpu(), [0.85] * 30)
    assert easy["ratio"] < 0.6


def test_a_generations_first_speculative_step_weighs_as_a_probe():
    """Speculation carried over from the last answer keeps that answer's calibration and gain curve; its
    first step in a new generation enters with a probe's weights (``alpha_probe``, ``curve_probe``), the
    steps after it with the running ones (H200 MT-Bench: two answers speculated through 135
    and 26 steps at 0.77-0.78x plain on the statistics of the answer before)."""
    from tfm_local.decode.step import StepRecord

    auto = AutoBudget.on_gpu(costs=LinearCosts(0.002, 0.00002))
    strong = gain_curve(np.log(np.full(15, 0.9)) * np.arange(1, 16), 15)
    for _ in range(50):  # a long run of a drafter right 90% of a position
        auto.observe_spec(16, 0.004, 0.0015, strong, 15, 6)
    auto._spec = True

    def step():
        rec = StepRecord(pos=0, budget=15, n_nodes=16, tokens=[1], curve=WEAK)
        rec.phases["verify"], rec.phases["drafter"] = 0.004, 0.0015
        auto.observe(rec)

    auto.begin(True)
    a0 = auto.accepted
    step()
    a1 = auto.accepted
    assert a1 == pytest.approx(0.7 * a0) and auto.curve[-1] == pytest.approx(WEAK[-1])  # a probe's weights
    step()
    assert auto.accepted == pytest.approx(0.97 * a1)  # the running weight (0.03) from the second step on


def test_probe_spacing_is_net_of_what_speculation_saved_within_bounds():
    """The spacing floor is the probe cycle's cost net of ``probe_gain``; a gain sample counts between 0
    and ``PROBE_OUTLIER`` cycles' cost (a losing run carried into a harder text pushed the probes out to
    ``probe_cap``, a long winning one lifted the floor for many probes); a running cost that reached 0 takes
    the next sample (capped at twice 0 it stayed 0, and the floor with it)."""
    from tfm_local.decode.budget import PROBE_OUTLIER, running_cost
    from tfm_local.decode.step import StepRecord

    auto = AutoBudget(costs=PassCosts())
    auto.observe_plain(0.002)
    auto.probe_cost, auto._n_cycles = 0.02, 2  # 20 ms a cycle: 2,000 steps keep it at 0.5% of 2 ms steps
    assert 1999 <= auto._spacing(8) <= 2001
    auto.probe_gain = 0.015
    assert 499 <= auto._spacing(8) <= 501
    auto.probe_gain = 0.05
    assert auto._spacing(8) == 8
    assert running_cost(0.0, 0.03, 0.2, False) == 0.03

    def run(t_spec: float) -> float:
        a = AutoBudget(costs=PassCosts())
        a.observe_plain(0.002)
        a.plain_s, a.probe_cost, a._n_cycles = 0.002, 0.02, 2
        for _ in range(100):  # speculative steps of 2 tokens
            rec = StepRecord(pos=0, budget=3, n_nodes=4, tokens=[1, 2], curve=WEAK)
            rec.phases["verify"] = t_spec
            a._account(rec)
        probe = StepRecord(pos=0, budget=3, n_nodes=4, tokens=[1], curve=WEAK, probe=True)
        probe.phases["verify"] = 0.006
        a._account(probe)
        return a.probe_gain, a.probe_cost

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
        auto = AutoBudget(costs=PassCosts())
        auto.observe_plain(0.002)
        auto.plain_s, auto.draft_s, auto._n_cycles = 0.002, 0.001, 2
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
    assert auto._prompt_s == 0.0
    auto.observe_prompt(0.010)
    step(auto, probe=True)
    # the cycle: the prompt's 10 ms and the probe step's 5 ms beyond 2 plain tokens' 4 ms
    assert auto.probe_cost == pytest.approx(0.011) and auto._prompt_s == 0.0
    auto = fresh()
    auto.observe_prompt(0.010)
    step(auto, probe=False)  # speculation from the first step: 4 ms of tokens for 5 ms, and the prompt
    assert auto._earned == pytest.approx(-0.011) and auto._cycle == 0.0
    auto = fresh()
    auto.observe_prompt(0.010)
    step(auto, probe=False, spec=False)  # a capturing plain step first: the prompt opens the cycle
    assert auto._cycle == pytest.approx(0.010) and auto._earned == 0.0


def test_engine_prices_the_prompts_it_captures(pair):
    """The engine reports the time of a captured prompt's features into the drafter (``observe_prompt``)
    once per generation that captured its prompt, and never for one that did not."""
    from tfm_local.engine import Engine

    target, drafter = pair
    with Engine(target, drafter, n_ctx=512) as e:
        ids = e.prompt_tokens(PROMPT)
        seen = []
        real = e.auto.observe_prompt
        e.auto.observe_prompt = lambda s: seen.append(s) or real(s)
        list(e.generate_ids(ids, 8, plain_sp()))  # no statistics yet: the first generation drafts
        assert len(seen) == 1 and seen[0] > 0
        e.auto.plan = lambda max_tokens, k_max: False  # a generation that decodes plainly
        list(e.generate_ids(ids, 8, plain_sp()))
        assert len(seen) == 1


@pytest.mark.parametrize("saved", [0.01, -0.01])
def test_a_speculation_run_that_stops_re_probes_soon_only_if_it_saved_time(saved):
    """When speculation stops paying, the next probe comes after ``probe_min`` steps if the run saved
    time (a few unlucky steps can stop a run that pays) and on the schedule it had if it lost (re-probing
    a losing run soon restarted it over and over: replayed MT-Bench, 0.982 / 0.964x plain against 0.987
    / 0.973x). Either way the run's account starts again from 0."""
    auto = _weak_auto()
    auto._spec, auto._run, auto._probe_every = True, saved, 200
    assert auto.choose(15) == 0
    assert auto._probe_every == (auto.probe_min if saved > 0 else 200)
    assert auto._since_probe == 1 and auto._run == 0.0 and not auto._spec


def test_a_speculation_runs_account_counts_its_steps_savings():
    """``_run`` sums, over the speculative (not probe) steps of the run under way, the plain time of the
    tokens they emitted minus their own time."""
    from tfm_local.decode.step import StepRecord

    auto = AutoBudget(costs=PassCosts())
    auto.observe_plain(0.002)
    auto.plain_s = 0.002
    for tokens, t, probe in [(3, 0.004, False), (1, 0.004, False), (4, 0.004, True)]:
        rec = StepRecord(pos=0, budget=7, n_nodes=8, tokens=[1] * tokens, curve=WEAK[:7], probe=probe)
        rec.phases["verify"] = t
        auto.observe(rec)
    assert auto._run == pytest.approx((0.006 - 0.004) + (0.002 - 0.004))


def test_a_curve_beyond_a_shallow_probes_depth_is_the_drafters_own():
    """A probe drafts only its budget deep and the rest of its curve is extrapolated (as a chain: every
    further position right as often as the last); the first full curve a speculative step brings replaces
    that extrapolation instead of being blended into it (after a 1-deep probe that accepted, the
    extrapolation priced budget 31 at ~9 tokens and the blend kept it there for 14 steps on a text whose
    drafts took ~1.5; replayed MT-Bench). Within the probe's depth the two blend as before."""
    auto = AutoBudget.on_gpu()
    auto.observe_plain(0.002)
    auto.observe_spec(2, 0.0023, 0.001, np.array([0.95]), 1, 1, probe=True)   # a 1-deep probe
    assert auto._depth == 1 and auto._curve(31)[30] > 8                    # extrapolated as a chain
    full = gain_curve(np.log(np.full(63, 0.6)) * np.arange(1, 64), 63)    # the drafter's real curve
    auto.observe_spec(32, 0.0069, 0.001, full, 31, 1)
    blend = (1 - auto.alpha) * 0.95 + auto.alpha * full[0]
    assert auto.curve[0] == pytest.approx(blend)
    np.testing.assert_allclose(np.diff(auto.curve[:63]), np.diff(full), atol=1e-12)
    assert auto._depth == 63 and auto._curve(31)[30] < 2
    old = AutoBudget.on_gpu(measured_depth=False)
    old.observe_plain(0.002)
    old.observe_spec(2, 0.0023, 0.001, np.array([0.95]), 1, 1, probe=True)
    old.observe_spec(32, 0.0069, 0.001, full, 31, 1)
    assert old._curve(31)[30] > 6


def test_a_blend_beyond_the_measured_depth_never_falls():
    """A new curve shorter than the running one (the context's room cut the draft) but deeper than its
    measured depth continues to the running curve's length with its own increments: the curve never
    falls (it did where the replaced part met the old blend)."""
    auto = AutoBudget.on_gpu()
    auto.observe_plain(0.002)
    full = gain_curve(np.log(np.full(63, 0.6)) * np.arange(1, 64), 63)
    auto.observe_spec(64, 0.007, 0.001, full, 63, 1)
    auto.observe_spec(8, 0.003, 0.001, np.full(7, 0.05), 7, 0, probe=True)   # a 7-deep probe that missed
    assert auto._depth == 7 and len(auto.curve) == 63
    good = gain_curve(np.log(np.full(20, 0.9)) * np.arange(1, 21), 20)
    auto.observe_spec(21, 0.004, 0.001, good, 20, 5)
    assert np.all(np.diff(auto.curve) >= -1e-12) and auto.curve[62] >= auto.curve[19]
