"""The automatic budget in the engine: lossless, following the cost model, its state per draft shape, stretches, prompts."""
from __future__ import annotations

import numpy as np
import pytest

from budget_helpers import LinearCosts, policy
from tfm_local.decode.budget import BudgetPolicy

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
            e.auto.gain.accepted = e.auto.gain.predicted = 0.0
            e.auto.probes.since = e.auto.probes.every  # the probes are far apart now (their cost): one is due
            assert list(e.generate_ids(ids, 60, plain_sp())) == ref
        finally:
            e.drafter = real
        assert e.stats.n_spec_steps >= e.stats.n_steps - 3 and e.stats.tau > 4


def fixed_draft_time(auto: BudgetPolicy, seconds: float) -> None:
    """Make the chooser see a stated drafting time (measured times vary with the machine's load)."""
    real = auto.observe_spec

    def observe(n_nodes, verify_s, draft_s, curve, budget, accepted, record=True, probe=False, depth=None):
        real(n_nodes, verify_s, seconds, curve, budget, accepted, record=record, probe=probe, depth=depth)
        auto.draft_s = seconds  # one drafting cost at every depth (the depths measured are forgotten)

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
        e.auto.probes.every = 10_000  # no probe near: only the recheck (32) bounds a stretch
        before = e.auto.probes.since
        gen = e.generate_ids(ids, 200, plain_sp())
        out = [next(gen) for _ in range(50)]
        gen.close()
        assert len(out) == 50
        steps = e.stats.n_steps
        # 49 decode steps (the prefill gave the first token): a decided step, a stretch of 31, a decided
        # step, and 16 steps of the next stretch when the consumer stopped
        assert steps == 49 and (seen["single"], seen["stretch"]) == (2, 47)
        assert e.auto.probes.since - before == steps


@pytest.mark.parametrize("tree", ["chain", "ddtree"])
def test_engine_gpu_budget_verifies_passes_of_the_allowed_sizes_only(pair, tree):
    """The engine with the GPU profile (what it takes on a GPU), drafts that are always right and
    GPU-like costs: lossless, speculating, and every verification pass has one of ``GPU_SIZES`` nodes
    (or one token), also in the last steps of a generation where fewer tokens are wanted."""
    from tfm_local.decode.budget import GPU_SIZES
    from tfm_local.engine import Engine

    target, drafter = pair
    with Engine(target, None, n_ctx=512) as plain, Engine(target, drafter, n_ctx=512, tree=tree) as e:
        ids = plain.prompt_tokens(PROMPT)
        ref = list(plain.generate_ids(ids, 45, plain_sp()))
        e._auto_states[tree] = e.auto = policy(gpu=True, costs=LinearCosts(0.004, 0.00002))
        fixed_draft_time(e.auto, 0.001)
        sizes, observe = [], e.auto.observe

        def record(rec):
            sizes.append(rec.n_nodes)
            return observe(rec)

        e.auto.observe = record
        real = e.drafter
        e.drafter = ScriptMarginals(real, len(ids), ref)
        try:
            assert list(e.generate_ids(ids, 45, plain_sp())) == ref
        finally:
            e.drafter = real
        assert e.stats.n_spec_steps >= 3 and e.stats.tau > 3
        assert set(sizes) <= {1, *GPU_SIZES} and len(set(sizes) - {1}) >= 1, sizes


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
        e.auto.capture_prompt = lambda max_tokens, k_max: False  # a generation that decodes plainly
        list(e.generate_ids(ids, 8, plain_sp()))
        assert len(seen) == 1
