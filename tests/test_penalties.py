"""Frequency, presence and repeat penalties: their arithmetic, plain decoding under them, and
losslessness under speculation (chain and trees, greedy and sampled).

The penalised distribution of a position depends on every token before it, so a speculative step
must process each verified node's row with the penalty state of its own path: the tokens generated
in earlier steps and the node's accepted ancestors. Oracle drafters (test_engine, test_tree_verify)
make long accepted paths happen, so that this state matters inside a step.
"""
from collections import Counter

import numpy as np
import pytest

from tfm_local.decode.penalties import Penalties
from tfm_local.decode.sampling import SamplingParams
from tfm_local.decode.verify import Target
from tfm_local.engine import Engine
from tfm_local.llama.model import gpu_available
from tfm_local.lossless import classify
from tfm_local.testing.synth import write_tiny_target

from test_engine import PROMPTS, OracleDrafter, assert_same_distribution, run_ids, run_with_drafter
from test_tree_verify import REL_TOL, TreeOracle

#: Penalties strong enough to change the tiny random target's repetitive greedy output.
STRONG = dict(frequency_penalty=1.5, presence_penalty=0.5, repeat_penalty=1.3, repeat_last_n=16)


def penalised_reference(x, prompt, generated, sp) -> np.ndarray:
    """The penalised row, written from the definitions token by token (float32 as the engine)."""
    x = np.array(x, dtype=np.float32)
    n = sp.repeat_last_n
    window = [] if n == 0 or sp.repeat_penalty == 1 else (list(prompt) + list(generated))[-n:] if n > 0 \
        else list(prompt) + list(generated)
    r = np.float32(sp.repeat_penalty)
    for j in set(window):
        x[j] = x[j] / r if x[j] > 0 else x[j] * r
    for j, c in Counter(generated).items():
        x[j] -= np.float32(c) * np.float32(sp.frequency_penalty) + np.float32(sp.presence_penalty)
    return x


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp("penalties")
    target = write_tiny_target(d / "target.gguf", n_layer=4, n_embd=64)
    drafter, _ = init_random(target, d / "drafter.gguf", layers=1, seed=1)
    return target, drafter


@pytest.fixture(scope="module")
def plain(paths):
    with Engine(paths[0], None, n_ctx=512) as e:
        yield e


@pytest.fixture(scope="module")
def spec(paths):
    with Engine(paths[0], paths[1], n_ctx=512, budget=None) as e:  # fixed budget: every step drafts
        yield e


# -- arithmetic ---------------------------------------------------------------------------
@pytest.mark.parametrize("sp", [SamplingParams(frequency_penalty=0.7), SamplingParams(presence_penalty=-1.2),
                                SamplingParams(repeat_penalty=1.5, repeat_last_n=5),
                                SamplingParams(repeat_penalty=0.8, repeat_last_n=-1),
                                SamplingParams(repeat_penalty=1.5, repeat_last_n=0, frequency_penalty=2.0),
                                SamplingParams(**STRONG)], ids=str)
def test_penalties_follow_their_definitions(sp):
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 40, 12).tolist()
    p = Penalties(sp, prompt)
    generated = []
    for _ in range(30):
        x = rng.normal(0, 3, 50).astype(np.float32)
        before = x.copy()
        got = p.apply(x)
        assert np.array_equal(x, before), "apply must not change its input"
        assert got.dtype == np.float32
        assert np.allclose(got, penalised_reference(x, prompt, generated, sp), rtol=0, atol=1e-6)
        t = int(rng.integers(0, 40))
        p.push(t)
        generated.append(t)


def test_penalties_off_by_default_and_checked():
    assert not SamplingParams().penalised
    assert not SamplingParams(repeat_penalty=1.3, repeat_last_n=0).penalised
    assert SamplingParams(presence_penalty=0.1).penalised and SamplingParams(repeat_penalty=1.1).penalised
    for bad in (dict(frequency_penalty=2.5), dict(presence_penalty=-2.01), dict(frequency_penalty=float("nan")),
                dict(repeat_penalty=0.0), dict(repeat_penalty=float("inf")), dict(repeat_last_n=-2),
                dict(repeat_last_n=1.5), dict(presence_penalty="1")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


# -- plain decoding -----------------------------------------------------------------------
def test_plain_greedy_takes_the_argmax_of_the_penalised_logits(paths, plain):
    """Each token is the argmax of the penalised row of a fresh prefill of everything before it, and the
    penalties change the output of this repetitive target."""
    sp = SamplingParams(**STRONG)
    ref_target = Target(paths[0], n_ctx=512)
    try:
        for prompt in PROMPTS:
            ids = plain.prompt_tokens(prompt)
            out = run_ids(plain, prompt, 24, sp)
            for i, t in enumerate(out):
                x = penalised_reference(ref_target.prefill(ids + out[:i]), ids, out[:i], sp)
                assert t == int(np.argmax(x)), f"{prompt!r} token {i}"
            assert out != run_ids(plain, prompt, 24), "the penalties must change this output"
            assert len(set(out)) > len(set(run_ids(plain, prompt, 24))), "penalised output repeats less"
    finally:
        ref_target.close()


# -- losslessness under speculation ---------------------------------------------------------
def assert_equal_or_near_tie(path, prompt_ids, ref, out, sp):
    """``out == ref``, or they part at a near-tie of the penalised logits (the project's rule,
    ``lossless.classify``, with test_tree_verify's tolerance relative to the largest logit): a tree pass
    computes the logits with other reductions than one-token decoding."""
    t = Target(path, n_ctx=512)
    try:
        d = classify(t, prompt_ids, ref, out, rel=REL_TOL, sp=sp)
    finally:
        t.close()
    assert d is None or d.near_tie, d


@pytest.mark.parametrize("p_wrong", [0.0, 0.3])
def test_greedy_chain_equals_plain_under_penalties(plain, spec, p_wrong):
    sp = SamplingParams(**STRONG)
    for prompt in PROMPTS:
        ref = run_ids(plain, prompt, 48, sp)
        oracle = OracleDrafter(spec.drafter, len(plain.prompt_tokens(prompt)), ref, p_wrong)
        assert run_with_drafter(spec, oracle, prompt, 48, sp) == ref
        if p_wrong == 0:
            assert spec.stats.tau > 3, "whole accepted paths must have run through the penalties"
        assert run_ids(spec, prompt, 32, sp) == ref[:32]  # the random drafter's drafts


@pytest.mark.parametrize("mode", ["ddtree", "wide"])
def test_greedy_trees_equal_plain_under_penalties(paths, plain, mode):
    """A tree node's penalties count its own ancestors: a node whose token repeats an ancestor's is
    penalised by it, its sibling is not."""
    sp = SamplingParams(**STRONG)
    with Engine(paths[0], paths[1], n_ctx=512, tree=mode, budget=24) as e:
        for prompt in PROMPTS:
            ids = plain.prompt_tokens(prompt)
            ref = run_ids(plain, prompt, 48, sp)
            oracle = TreeOracle(e.drafter, len(ids), ref, 0.0)
            out = run_with_drafter(e, oracle, prompt, 48, sp)
            assert_equal_or_near_tie(paths[0], ids, ref, out, sp)
            # whole accepted paths ran through the penalties; after a near-tie flip (25-node passes take
            # the GEMMs, whose sums differ from one-token decoding) the script no longer matches
            assert e.stats.tau > 1.5 or out != ref
            assert_equal_or_near_tie(paths[0], ids, ref[:24], run_ids(e, prompt, 24, sp), sp)


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_sampled_same_seed_same_output_under_penalties(paths, plain, mode):
    """Sampled with a seed: the keyed draws of the penalised distribution are plain decoding's."""
    if gpu_available():
        pytest.skip("CUDA's batched and one-row kernels differ numerically (see the distribution test)")
    sp = SamplingParams(temperature=0.8, top_p=0.95, seed=11, **STRONG)
    with Engine(paths[0], paths[1], n_ctx=512, tree=mode, budget=None if mode == "chain" else 24) as e:
        for prompt in PROMPTS:
            ref = run_ids(plain, prompt, 40, sp)
            assert ref != run_ids(plain, prompt, 40, SamplingParams(temperature=0.8, top_p=0.95, seed=11))
            oracle = (OracleDrafter if mode == "chain" else TreeOracle)(
                e.drafter, len(plain.prompt_tokens(prompt)), ref, 0.2 if mode == "chain" else 0.0)
            assert run_with_drafter(e, oracle, prompt, 40, sp) == ref
            assert e.stats.tau > 1.5


def test_sampled_distribution_equals_plain_under_penalties(plain, spec):
    """Two-sample chi-square on the first 3 tokens over 300 seeds each (false-alarm rate 1e-3); the
    oracle's script is fixed, so drafts are accepted or rejected at random and the penalty state of
    accepted paths is exercised."""
    sp_args = dict(temperature=1.0, top_k=4, presence_penalty=2.0, frequency_penalty=1.0)
    prompt = PROMPTS[2]
    script = run_ids(plain, prompt, 6, SamplingParams(presence_penalty=2.0))
    a = assert_same_distribution(plain, spec, prompt, script, 3, sp_args)
    # the penalties shaped it: a repeated token (presence 2) is rarer than without them
    unpen = [tuple(run_ids(plain, prompt, 3, SamplingParams(seed=s, temperature=1.0, top_k=4))) for s in range(300)]
    repeats = lambda outs: sum(len(set(o)) < len(o) for o in outs)  # noqa: E731
    assert repeats(a) < repeats(unpen)


def test_generate_takes_the_penalties(plain):
    """``Engine.generate`` passes the penalties on and checks them."""
    assert plain.generate(PROMPTS[0], max_tokens=24, **STRONG) != plain.generate(PROMPTS[0], max_tokens=24)
    with pytest.raises(ValueError, match="presence_penalty"):
        plain.generate(PROMPTS[0], max_tokens=4, presence_penalty=3.0)
