"""One decode step (tfm_local.decode.step) and the one verify / commit of the target, on tiny GGUFs.

``Target.verify`` takes any tree (a chain is a tree) and decides how to decode it: a plain causal
batch for a chain on a target that can cut its cache back, tree mode otherwise (a hybrid's chain
too, so that a prefix of it can be committed). ``run_step`` returns the record that the statistics
and the automatic budget read.
"""
from __future__ import annotations

import numpy as np
import pytest

from tfm_local.decode.budget import BudgetPolicy
from tfm_local.decode.draft import DFlashDrafter
from tfm_local.decode.methods import make_method
from tfm_local.decode.sampling import SamplingParams, TokenChooser
from tfm_local.decode.stats import PHASES, GenerationStats
from tfm_local.decode.step import StepRecord, draft_limit, run_step
from tfm_local.decode.verify import Target
from tfm_local.testing.synth import write_tiny_target

from test_drafter_topk import PROMPT, paths  # noqa: F401  (paths: the tiny qwen2 target + random drafter)
from test_tree_gdn_model import close, hybrid, plain_logits, ref_target  # noqa: F401  (fixtures)

GREEDY = TokenChooser(SamplingParams())


def test_commit_needs_a_verification_and_happens_once(paths):
    t = Target(paths[0], n_ctx=128, n_batch=32, n_threads=1)
    t.prefill(PROMPT)
    with pytest.raises(ValueError, match="nothing to commit"):
        t.commit([0])
    t.verify([5, 6])
    with pytest.raises(ValueError, match="root-to-node"):
        t.commit([1])
    t.commit([0])
    assert t.n_past == len(PROMPT) + 1
    with pytest.raises(ValueError, match="nothing to commit"):
        t.commit([0])
    t.close()


def test_a_chain_shaped_tree_is_the_plain_chain(paths):
    """On a target that can cut its cache back, chain parents decode exactly as the plain chain."""
    t = Target(paths[0], n_ctx=128, n_batch=32, n_threads=1)
    t.prefill(PROMPT)
    tokens = [5, 6, 7, 8]
    plain = np.array(t.verify(tokens).logits)
    t.commit([])
    chain = t.verify(np.array(tokens), np.arange(-1, 3))
    assert isinstance(chain.logits, np.ndarray)  # no node reordering: the batch's own rows
    np.testing.assert_array_equal(np.array(chain.logits), plain)
    t.commit([0, 1])
    assert t.n_past == len(PROMPT) + 2
    t.close()


def test_a_hybrid_commits_a_prefix_of_a_chain(hybrid, ref_target):
    """A recurrent hybrid verifies a chain in tree mode; a prefix of it is then committed exactly."""
    t = Target(hybrid, n_ctx=256, n_batch=64)
    prompt = t.tok.encode("The tree verify")
    t.prefill(prompt)
    tokens = np.array([20, 21, 22, 23], np.int32)
    t.verify(tokens, np.arange(-1, 3))
    t.commit([0, 1])
    probe = [30, 31]
    got = np.array(t.verify(probe).logits)
    ref = plain_logits(ref_target, prompt + [20, 21], probe)
    assert all(close(got[i], ref[i]) for i in range(len(probe)))
    t.close()


def test_verdict_choice_by_rule(paths):
    """The verdict gives the target's choice per node: the backend argmax's ids or the host rule."""
    t = Target(paths[0], n_ctx=128, n_batch=32, n_threads=1)
    t.prefill(PROMPT)
    parents = np.array([-1, 0, 0, 1])
    host = t.verify([5, 6, 7, 8], parents)
    logits = np.array(host.logits)
    assert [host.choice(i, GREEDY) for i in range(4)] == list(np.argmax(logits, axis=1))
    t.commit([])
    if t.attach_argmax(4):
        backend = t.verify([5, 6, 7, 8], parents, backend_choice=True)
        assert backend.logits is None and backend.ids.shape == (4,)
        assert [backend.chooser(GREEDY)(i) for i in range(4)] == [int(x) for x in backend.ids]
    t.close()


def _pair(paths):
    tgt = Target(paths[0], n_ctx=128, n_batch=32, n_threads=1)
    dft = DFlashDrafter(paths[1], tgt, n_threads=1)
    last = GREEDY(tgt.prefill(PROMPT, lambda s, n: dft.inject(tgt.features(slice(0, n), n), s)), len(PROMPT))
    return tgt, dft, last


@pytest.mark.parametrize("tree", ["chain", "ddtree", "wide"])
def test_run_step_records_what_it_did(paths, tree):
    tgt, dft, last = _pair(paths)
    pos = tgt.n_past
    rec = run_step(tgt, dft, make_method(tree, top_k=4, width=2), 5, None, last, 100, GREEDY, False)
    assert isinstance(rec, StepRecord) and rec.speculative and rec.budget == 5
    assert rec.pos == pos and rec.n_nodes == 6 and 1 <= len(rec.tokens) <= 6
    assert tgt.n_past == pos + len(rec.tokens) and rec.n_accepted == len(rec.tokens) - 1
    assert set(rec.phases) == set(PHASES) and all(v >= 0 for v in rec.phases.values())
    assert rec.t_draft == pytest.approx(rec.phases["drafter"] + rec.phases["tree"])
    assert rec.t_verify == pytest.approx(rec.phases["submit"] + rec.phases["verify"] + rec.phases["accept"])
    assert rec.curve is None  # a fixed budget computes no gain curve
    dft.close()
    tgt.close()


def test_plain_step_and_what_consumes_records(paths):
    tgt, dft, last = _pair(paths)
    plain = run_step(tgt, dft, make_method(), 0, None, last, 100, GREEDY, False)  # budget 0: a plain step
    assert dft.n_injected + len(dft._pending) == tgt.n_past  # its row waits for the next draft
    assert not plain.speculative and plain.n_nodes == 1 and len(plain.tokens) == 1 and plain.budget == 0
    auto = BudgetPolicy()
    auto.observe(plain)
    assert auto.costs.known(1) and auto.gain.curve is None
    spec = run_step(tgt, dft, make_method("ddtree", top_k=4), 15, auto, plain.tokens[0], 100, GREEDY, False)
    assert spec.speculative and spec.curve is not None  # the first auto step is a probe of one token
    auto.observe(spec)
    assert auto.gain.curve is not None and auto.draft_s == pytest.approx(spec.t_draft - spec.t_sync)
    st = GenerationStats()
    for rec in (plain, spec):
        st.add_step(rec)
    assert (st.n_steps, st.n_spec_steps) == (2, 1)
    assert st.n_step_tokens == len(plain.tokens) + len(spec.tokens)
    assert st.n_drafted == spec.n_nodes - 1
    assert st.t_draft == pytest.approx(plain.t_draft + spec.t_draft)
    assert sum(st.t_phases.values()) == pytest.approx(st.t_draft + st.t_verify)
    dft.close()
    tgt.close()


def test_draft_limit_bounds(tmp_path):
    target = write_tiny_target(tmp_path / "t.gguf", n_layer=1, n_embd=32, seed=3)
    t = Target(target, n_ctx=40, n_batch=16, n_threads=1)
    t.prefill(list(range(1, 31)))
    assert draft_limit(63, 100, t) == 9     # the context: 40 - 30 - 1
    assert draft_limit(63, 4, t) == 3       # the tokens still wanted, the target's own included
    assert draft_limit(5, 100, t) == 5      # the budget
    t.model.on_gpu = True                   # flat pass costs: the tree keeps its size at the end ...
    assert draft_limit(5, 4, t) == 5 and draft_limit(63, 4, t) == 9
    assert draft_limit(5, 1, t) == 0        # ... but the last token is a plain step
    t.model.on_gpu = False
    t.close()
    t = Target(target, n_ctx=200, n_batch=16, n_threads=1)
    t.prefill([1, 2, 3])
    assert draft_limit(63, 100, t) == 15    # one batch
    t.close()


def test_verify_refuses_before_any_native_call(paths):
    """A second verify before a commit, and malformed tokens, are refused with the target still usable."""
    t = Target(paths[0], n_ctx=128, n_batch=32, n_threads=1)
    t.prefill(PROMPT)
    first = np.array(t.verify([5, 6, 7], [-1, 0, 0]).logits)
    with pytest.raises(ValueError, match="not committed"):
        t.verify([5, 6, 7], [-1, 0, 0])
    t.commit([0, 2])
    for bad in ([], [1.5, 2.0], [[1, 2]]):
        with pytest.raises(ValueError, match="integer token ids"):
            t.verify(bad)
    with pytest.raises(ValueError, match="nothing to commit"):
        t.commit([0])
    got = np.array(t.verify([9]).logits)[0]
    t.commit([0])
    ref = Target(paths[0], n_ctx=128, n_batch=32, n_threads=1)
    ref.prefill(PROMPT + [5, 7])
    assert close(got, np.array(ref.verify([9]).logits)[0])  # the committed path is [5, 7]: batch shapes differ
    assert first.shape == (3, t.model.n_vocab)
    ref.close()
    t.close()


def test_engine_checks_options_before_loading_models(tmp_path):
    from tfm_local.engine import Engine

    missing = tmp_path / "nothing-here.gguf"  # a model would fail to load: these fail first
    for kw, msg in [({"tree": "bogus"}, "unknown tree mode"), ({"tree_width": 0}, "must be >= 1"),
                    ({"budget": -2}, "budget must be >= 0"), ({"budget": "x"}, "budget must be"),
                    ({"greedy_argmax": "gpu"}, "greedy argmax")]:
        with pytest.raises(ValueError, match=msg):
            Engine(missing, **kw)


def test_generate_checks_max_tokens_when_called(paths):
    from tfm_local.engine import Engine

    with Engine(paths[0], drafter=None, n_ctx=128, n_threads=1) as e:
        for n in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="max_tokens"):
                e.generate("Hi", max_tokens=n, stream=True)


def test_a_hole_in_the_drafter_cache_closes_up(paths):
    """Rows that skip committed tokens (the automatic budget's plain stretch, no capture) sit right
    after the earlier rows in the drafter's cache (llama.cpp needs consecutive positions): the
    drafter then drafts as one given the same rows contiguously; a rewind keeps the bookkeeping."""
    from test_drafter_topk import assert_rows_equal_or_close

    tgt = Target(paths[0], n_ctx=128, n_batch=32, n_threads=1)
    holed, ref = (DFlashDrafter(paths[1], tgt, n_threads=1) for _ in range(2))
    tgt.prefill(PROMPT, lambda s, n: [d.inject(tgt.features(slice(0, n), n), s) for d in (holed, ref)])
    p = len(PROMPT)
    tgt.set_features([])  # three plain steps without capture
    for tok in (5, 6, 7):
        tgt.verify([tok])
        tgt.commit([0])
    tgt.set_features(holed.layers)  # two with capture, deferred
    rows = []
    for tok in (8, 9):
        tgt.verify([tok])
        tgt.commit([0])
        rows.append(tgt.features(slice(0, 1), 1))
        holed.defer(rows[-1], tgt.n_past - 1)
    ref.inject(np.concatenate(rows), p)
    got = np.array(holed.marginals(10, p + 5, 8))
    assert holed.n_injected == p + 5 and holed.shift == 3 and holed.pending == 0
    assert_rows_equal_or_close(got, np.array(ref.marginals(10, p + 2, 8)))
    holed.inject(rows[1], p + 4)  # a rewind past the hole's rows
    assert holed.n_injected == p + 5 and holed.shift == 3
    holed.inject(rows[0], p + 1)  # a rewind into the hole: it shrinks
    assert holed.n_injected == p + 2 and holed.shift == 0 and holed.ctx.pos_max() == p + 1
    for d in (holed, ref, tgt):
        d.close()


def test_capture_switched_every_step_gives_the_features_of_a_capture_always_on(paths):
    """Turning the layer-input capture on and off between passes (patch 0013: a layer input, once
    captured, stays a graph output) leaves the graph as it is: it is reused across the switches, and
    the features and logits equal those of a target that captures throughout. The first capture plans
    the graph's allocation anew (a reused plan would let later nodes overwrite the layer inputs)."""
    from tfm_local.llama.native import graphs_reused

    layers = DFlashDrafter(paths[1], Target(paths[0], n_ctx=128, n_threads=1), n_threads=1).layers
    toggled, always = (Target(paths[0], n_ctx=128, n_batch=32, n_threads=1) for _ in range(2))
    always.set_features(layers)
    for t in (toggled, always):
        t.prefill(PROMPT)
    reused = []
    for i, tok in enumerate([5, 6, 7, 8, 9, 10, 11, 12]):
        on = i % 3 != 1
        toggled.set_features(layers if on else [])
        before = graphs_reused(toggled.ctx.ptr)
        got, ref = (np.array(t.verify([tok]).logits) for t in (toggled, always))
        reused.append(graphs_reused(toggled.ctx.ptr) - before)
        np.testing.assert_array_equal(got, ref)
        if on:
            np.testing.assert_array_equal(toggled.features(slice(0, 1), 1), always.features(slice(0, 1), 1))
        for t in (toggled, always):
            t.commit([0])
    assert reused == [0] + [1] * 7  # the first capture re-plans; no switch after it changes the graph
    for t in (toggled, always):
        t.close()
