"""tfm_local/bench/replay.py and tfm-bench replay: the chain replayed on recorded greedy outputs counts the
engine's own steps and tokens (tiny synthetic target; the drafter's proposals come from test_engine's
OracleDrafter, a stand-in for a trained drafter, seeded alike for the run and its replay)."""
import json

import pytest

from tfm_local.engine import Engine
from tfm_local.bench.replay import replay_chain, sequence_features

from tfm_local.testing.synth import write_tiny_target
from test_engine import OracleDrafter, PROMPTS, run_ids, run_with_drafter


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp("replay")
    target = write_tiny_target(d / "target.gguf", n_layer=4, n_embd=64)
    drafter, _ = init_random(target, d / "drafter.gguf", layers=1, seed=1)
    spec = Engine(target, drafter, n_ctx=512, budget=None)  # fixed budget: every step drafts the chain
    plain = Engine(target, None, n_ctx=512)
    yield spec, plain, target, drafter
    spec.close()
    plain.close()


@pytest.mark.parametrize("p_wrong,max_tokens", [(0.0, 40), (0.3, 40), (0.6, 33)])
def test_replay_counts_the_engines_chain_steps(pair, p_wrong, max_tokens):
    spec, plain, _, _ = pair
    for prompt in PROMPTS:
        ids = spec.prompt_tokens(prompt)
        ref = run_ids(plain, prompt, max_tokens + 20)
        live = OracleDrafter(spec.drafter, len(ids), ref, p_wrong, seed=3)
        out = run_with_drafter(spec, live, prompt, max_tokens)
        assert out == ref[:len(out)]
        feats = sequence_features(spec.target, ids + out)
        again = OracleDrafter(spec.drafter, len(ids), ref, p_wrong, seed=3)
        r = replay_chain(again, feats, len(ids), out, max_tokens)
        assert (r.n_steps, r.n_step_tokens, again.calls) == (spec.stats.n_steps, spec.stats.n_step_tokens, live.calls)
        assert r.tau == pytest.approx(spec.stats.tau) and len(r.accepted) == r.n_steps
        if p_wrong == 0.0:
            assert all(a == min(15, max_tokens - 2 - sum(x + 1 for x in r.accepted[:j]))
                       for j, a in enumerate(r.accepted[:-1]))


def test_replay_refuses_short_features(pair):
    spec, _, _, _ = pair
    ids = spec.prompt_tokens(PROMPTS[0])
    feats = sequence_features(spec.target, ids)
    with pytest.raises(ValueError, match="feature rows"):
        replay_chain(spec.drafter, feats, len(ids), [1, 2, 3], 10)
    with pytest.raises(ValueError, match="empty"):
        replay_chain(spec.drafter, feats, len(ids), [], 10)
