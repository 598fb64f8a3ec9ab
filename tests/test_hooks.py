"""The runtime's public hooks for measurement tools (lab/ uses them instead of patching internals):
``Context.observer`` (each llama.cpp decode), ``Engine.on_step`` with ``StepRecord.tree``, ``PhaseClock.observe``,
``Target.rewind``, ``Engine.budget_policy`` and ``BudgetPolicy.speculating``. Each leaves the outputs as they
are without it."""
from __future__ import annotations

import numpy as np
import pytest

from budget_helpers import WEAK, LinearCosts, policy
from tfm_local.decode.budget import gain_curve
from tfm_local.decode.sampling import SamplingParams
from tfm_local.decode.stats import PHASES, PhaseClock

PROMPT = list(range(5, 40))


@pytest.fixture(scope="module")
def engine(tiny_pair):
    from tfm_local.engine import Engine

    target, drafter = tiny_pair
    with Engine(target, drafter, n_threads=1, budget=4, tree="chain", warm_up=False) as eng:
        yield eng


class Recorder:
    """A ``DecodeObserver`` that keeps every call."""

    def __init__(self):
        self.events = []

    def before(self, ctx, what, n):
        self.events.append(("before", ctx, what, n, None))

    def after(self, ctx, what, n, seconds):
        self.events.append(("after", ctx, what, n, seconds))


def test_context_observer_sees_each_decode_before_and_after(engine):
    """The target context's observer sees the prefill's passes and one decode a step, of the step's tree size; the
    drafter's its own decodes; the tokens are those of a run without observers."""
    plain = list(engine.generate_ids(PROMPT, 16, SamplingParams()))
    tgt, dft = Recorder(), Recorder()
    steps = []
    engine.target.ctx.observer, engine.drafter.ctx.observer = tgt, dft
    engine.on_step = lambda rec, stretch: steps.append(rec.n_nodes)
    engine.prompt_cache.forget()  # a cold prefill of the whole prompt (a warm one decodes only its tail)
    try:
        out = list(engine.generate_ids(PROMPT, 16, SamplingParams()))
    finally:
        engine.target.ctx.observer = engine.drafter.ctx.observer = engine.on_step = None
    assert out == plain and len(steps) == engine.stats.n_steps
    for rec, ctx in ((tgt, engine.target.ctx), (dft, engine.drafter.ctx)):
        ev = rec.events
        assert ev and len(ev) % 2 == 0 and all(e[1] is ctx for e in ev)
        befores, afters = ev[0::2], ev[1::2]
        assert all(b[0] == "before" and a[0] == "after" and b[2:4] == a[2:4] and a[4] >= 0
                   for b, a in zip(befores, afters))
    r = engine.target.prefill_rows  # the prefill's passes
    chunks = [min(r, len(PROMPT) - s) for s in range(0, len(PROMPT), r)]
    assert [(e[2], e[3]) for e in tgt.events[0::2]] == [("tokens", n) for n in chunks + steps]
    assert {e[2] for e in dft.events} <= {"tokens", "embeddings"}
    n_events = len(tgt.events)
    engine.prompt_cache.forget()
    assert list(engine.generate_ids(PROMPT, 16, SamplingParams())) == plain and len(tgt.events) == n_events


@pytest.mark.parametrize("budget", [4, "auto"])
def test_on_step_gets_every_step_and_its_tree(engine, budget):
    """``on_step`` sees each step once, after the statistics took it: its tokens make the output after the
    prefill's token, its tree's root is the token before them; a plain stretch's steps are plain steps."""
    engine.set_budget(budget)
    seen = []
    engine.on_step = lambda rec, stretch: seen.append((rec, stretch))
    try:
        out = list(engine.generate_ids(PROMPT, 40, SamplingParams()))
    finally:
        engine.on_step = None
        engine.set_budget(4)
    st = engine.stats
    assert len(seen) == st.n_steps and sum(len(r.tokens) for r, _ in seen) == st.n_step_tokens
    emitted = out[:1]
    for rec, stretch in seen:
        assert rec.tree is not None and len(rec.tree) == rec.n_nodes and rec.tree.tokens[0] == emitted[-1]
        assert list(rec.tree.parents[:1]) == [-1]
        if stretch:
            assert budget == "auto" and rec.budget == 0 and not rec.capture and rec.n_nodes == 1
        emitted += rec.tokens
    assert emitted == out


def test_phase_clock_observe_sees_each_clock_and_mark(engine):
    calls = []
    PhaseClock.observe(calls.append)
    try:
        acc = dict.fromkeys(PHASES, 0.0)
        clock = PhaseClock(acc)
        clock.mark("tree")
        clock.mark("verify")
        assert calls == [None, "tree", "verify"] and acc["tree"] >= 0 and acc["verify"] >= 0
        calls.clear()
        list(engine.generate_ids(PROMPT, 12, SamplingParams()))
    finally:
        PhaseClock.observe(None)
    assert calls.count(None) == engine.stats.n_steps and calls[0] is None and set(calls) - {None} <= set(PHASES)
    PhaseClock(dict.fromkeys(PHASES, 0.0)).mark("accept")
    assert calls.count(None) == engine.stats.n_steps  # no observer: nothing more


def test_target_rewind_cuts_the_committed_tokens_back(tiny_pair):
    from tfm_local.decode.verify import Target

    target, _ = tiny_pair
    tg = Target(target, n_ctx=256, n_threads=1)
    try:
        # 16 tokens: both prefills stay within the small-batch products (patch 0015: every row has the bits
        # of a one-token pass), so the rewound cache and the fresh one hold the same rows
        ids = list(range(5, 21))
        tg.prefill(ids)
        tg.rewind(30)
        assert tg.n_past == 16 and tg.ctx.pos_max() == 15  # nothing past the committed tokens: no change
        tg.rewind(12)
        assert tg.n_past == 12 and tg.ctx.pos_max() == 11
        after = np.array(tg.verify([ids[12]]).logits[0])
        tg.commit([0])
        tg.reset()
        tg.prefill(ids[:12])
        fresh = np.array(tg.verify([ids[12]]).logits[0])
        tg.commit([])
        assert np.allclose(after, fresh, atol=1e-4) and int(np.argmax(after)) == int(np.argmax(fresh))
        tg.verify([ids[12]])
        with pytest.raises(ValueError, match="not committed"):
            tg.rewind(5)
        tg.commit([])
        assert tg.n_past == 12 and tg.ctx.pos_max() == 11
        for bad in (-1, 1.5, True):
            with pytest.raises(ValueError, match="token count"):
                tg.rewind(bad)
        tg.can_truncate = False  # as a recurrent hybrid
        tg.rewind(12)
        with pytest.raises(ValueError, match="cannot cut its cache back"):
            tg.rewind(5)
        assert tg.n_past == 12
    finally:
        tg.close()


def test_engine_budget_policy_is_kept_per_method(tiny_pair):
    from tfm_local.engine import Engine

    target, drafter = tiny_pair
    with Engine(target, drafter, n_threads=1, budget="auto", tree="chain", warm_up=False) as eng:
        chain = eng.budget_policy()
        assert eng.auto is chain and eng.budget_policy("chain") is chain
        dd = eng.budget_policy("ddtree")
        assert dd is not chain and dd.costs is chain.costs  # the target's pass costs are shared
        eng.set_draft("ddtree", "auto")
        assert eng.auto is dd and eng.budget_policy() is dd
        eng.set_draft("chain", 0)
        assert eng.auto is None
        eng.set_draft("chain", "auto")
        assert eng.auto is chain


def test_budget_policy_speculating():
    """True from a speculative decision (not a probe) until a "plain wins" one."""
    auto = policy(gpu=True, costs=LinearCosts(0.002, 0.00002))
    assert not auto.speculating
    strong = gain_curve(np.log(np.full(15, 0.9)) * np.arange(1, 16), 15)
    for _ in range(50):
        auto.observe_spec(16, 0.004, 0.0015, strong, 15, 6)
    assert auto.choose(15) > 0 and not auto.probing and auto.speculating
    for _ in range(60):  # the drafter stops being right: speculation stops paying
        auto.observe_spec(16, 0.004, 0.0015, WEAK, 15, 0)
        if auto.choose(15) == 0:
            break
    assert not auto.speculating and not auto.probing
    with pytest.raises(AttributeError):
        auto.speculating = True
