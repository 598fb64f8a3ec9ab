"""Greedy verification with the backend argmax (Target.attach_argmax, the top-1 sampler of patch 0004).

At temperature 0 the engine needs only each verified row's argmax; with ``greedy_argmax="backend"``
it is computed in the target's graph and no logits reach the host. Checked on tiny synthetic
targets (a qwen2 and the hybrid qwen35, whose chains are verified as trees): the target's argmax
rows equal np.argmax of its logits rows (chain, tree, prefill); the engine's greedy outputs with
the chain, DDTree and the automatic budget are the same with the backend argmax and with host
logits, and equal plain greedy decoding (itself with either rule); the row limit is enforced with
a clear error; the logits methods detach the sampler.
"""
import numpy as np
import pytest

from tfm_local.engine import Engine, backend_argmax_wanted
from tfm_local.decode.verify import Target

from tfm_local.testing.synth import write_tiny_target
from test_engine import PROMPTS, run_ids, run_with_drafter
from test_tree_verify import TreeOracle, assert_greedy_same_or_near_tie, random_tree


@pytest.fixture(scope="module", params=["qwen2", "qwen35"])
def pair(request, tmp_path_factory):
    """(target, drafter) paths: a tiny qwen2 or hybrid qwen35 target and a random drafter for it."""
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp(f"argmax-{request.param}")
    target = write_tiny_target(d / "t.gguf", arch=request.param, n_layer=4, n_embd=64, seed=7)
    drafter, _ = init_random(target, d / "d.gguf", layers=1, seed=3)
    return target, drafter


def test_argmax_rows_equal_host_argmax(pair):
    """prefill / verify of chains and trees with the backend argmax equal np.argmax of the logits."""
    t = Target(pair[0], n_ctx=256, n_batch=64)
    ref = Target(pair[0], n_ctx=256, n_batch=64)
    try:
        prompt = t.tok.encode(PROMPTS[0])
        assert t.attach_argmax(64)
        assert t.prefill_choice(prompt) == int(np.argmax(ref.prefill(prompt)))
        rng = np.random.default_rng(0)
        for n in (1, 5, 33):
            parents, tokens, depth = random_tree(rng, n, t.model.n_vocab)
            ids = t.verify(tokens, parents, depth, backend_choice=True).ids
            assert ids.dtype == np.int32 and ids.shape == (n,)
            logits = np.asarray(ref.verify(tokens, parents, depth).logits)
            assert list(ids) == list(np.argmax(logits, axis=1))
            t.commit([0])
            ref.commit([0])
        if t.can_truncate:
            chain = rng.integers(0, t.model.n_vocab, 9)
            assert list(t.verify(chain, backend_choice=True).ids) == list(np.argmax(ref.verify(chain).logits, axis=1))
    finally:
        t.close()
        ref.close()


def test_row_limit_and_detach(pair):
    t = Target(pair[0], n_ctx=128, n_batch=32)
    try:
        prompt = t.tok.encode(PROMPTS[2])
        with pytest.raises(RuntimeError, match="attach_argmax"):
            t.prefill_choice(prompt)
        for bad in (0, 33):
            with pytest.raises(ValueError, match="1..32"):
                t.attach_argmax(bad)
        assert t.attach_argmax(4) and t.argmax_rows == 4
        t.prefill_choice(prompt)
        tokens, depth, parents = np.arange(5) + 3, np.arange(5), np.arange(-1, 4)
        with pytest.raises(ValueError, match="5 output rows exceeds the backend chooser's limit of 4"):
            t.verify(tokens, parents, depth, backend_choice=True)
        assert t.attach_argmax(2) and t.argmax_rows == 4    # a smaller request keeps the limit
        assert t.attach_argmax(5) and t.argmax_rows == 5    # a larger one re-attaches
        assert len(t.verify(tokens, parents, depth, backend_choice=True).ids) == 5
        t.commit([0, 1])
        logits = t.prefill(prompt)                          # the logits methods detach
        assert t.argmax_rows == 0 and logits.shape == (t.model.n_vocab,) and np.isfinite(logits).all()
    finally:
        t.close()


def outputs(target, drafter, argmax, tree, budget, oracle_p=None):
    """Greedy outputs (40 tokens) of every prompt; with ``oracle_p`` a TreeOracle steers the drafts
    towards plain host-logits greedy's output (so that drafts get accepted)."""
    with Engine(target, drafter, n_ctx=512, tree=tree, budget=budget, greedy_argmax=argmax) as e:
        res = []
        for prompt in PROMPTS:
            if oracle_p is None:
                res.append(run_ids(e, prompt, 40))
            else:
                ref = oracle_p[1][len(res)]
                oracle = TreeOracle(e.drafter, len(e.prompt_tokens(prompt)), ref, oracle_p[0])
                res.append(run_with_drafter(e, oracle, prompt, 40))
        assert (e.target.argmax_rows > 0) == (argmax == "backend")
        return res


def test_engine_backend_argmax_equals_host_and_plain(pair):
    """Every prompt's output equals plain's (on a GPU build: or parts at a near-tie of plain's logits)."""
    target, drafter = pair
    with Engine(target, None, n_ctx=512) as e:
        prompt_ids = [e.prompt_tokens(prompt) for prompt in PROMPTS]

    def same_as_plain(got, plain):
        for ids, out, ref in zip(prompt_ids, got, plain):
            assert_greedy_same_or_near_tie(target, ids, out, ref)

    plain = outputs(target, None, "host", "chain", 0)
    same_as_plain(outputs(target, None, "backend", "chain", 0), plain)
    for tree, budget in (("chain", None), ("ddtree", 16), ("chain", "auto")):
        for p in (None, 0.3):
            oracle = None if p is None else (p, plain)
            same_as_plain(outputs(target, drafter, "backend", tree, budget, oracle), plain)
            same_as_plain(outputs(target, drafter, "host", tree, budget, oracle), plain)


def test_sampling_replaces_the_backend_argmax(pair):
    """Temperature > 0 draws in the graph whatever the greedy mode: same seed, same output in both modes."""
    from tfm_local.decode.sampling import SamplingParams

    sp = SamplingParams(temperature=0.8, seed=5)
    with Engine(pair[0], None, n_ctx=256, greedy_argmax="backend") as a, \
            Engine(pair[0], None, n_ctx=256, greedy_argmax="host") as b:
        run_ids(a, PROMPTS[0], 4)          # attaches
        assert run_ids(a, PROMPTS[0], 24, sp) == run_ids(b, PROMPTS[0], 24, sp)
        assert a.target.argmax_rows == 0 and a.target.choice_rows > 0


def test_argmax_mode_choice(monkeypatch):
    monkeypatch.delenv("TFM_GREEDY_ARGMAX", raising=False)
    assert backend_argmax_wanted("auto", on_gpu=True)        # measured faster on the H200
    assert not backend_argmax_wanted("auto", on_gpu=False)   # equal within noise on the CPU
    monkeypatch.setenv("TFM_GREEDY_ARGMAX", "backend")
    assert backend_argmax_wanted("auto", on_gpu=True) and backend_argmax_wanted("auto", on_gpu=False)
    assert backend_argmax_wanted("backend", on_gpu=False) and not backend_argmax_wanted("host", on_gpu=True)
    monkeypatch.setenv("TFM_GREEDY_ARGMAX", "host")
    assert not backend_argmax_wanted("auto", on_gpu=True)
    assert backend_argmax_wanted("backend", on_gpu=True)   # the explicit option wins
    monkeypatch.setenv("TFM_GREEDY_ARGMAX", "fast")
    with pytest.raises(ValueError, match="TFM_GREEDY_ARGMAX"):
        backend_argmax_wanted("auto", on_gpu=False)
    with pytest.raises(ValueError):
        backend_argmax_wanted("gpu", on_gpu=False)


def test_phase_times(pair):
    """Every step's time is split into PHASES; their sum stays within the decode time."""
    from tfm_local.decode.stats import PHASES

    with Engine(pair[0], pair[1], n_ctx=256, tree="ddtree", budget=8) as e:
        run_ids(e, PROMPTS[1], 16)
        ph = e.stats.t_phases
        assert set(ph) == set(PHASES) and all(v > 0 for v in ph.values())
        assert sum(ph.values()) <= e.stats.t_decode + 1e-6
        assert e.stats.to_dict()["t_other_phases"] >= 0
