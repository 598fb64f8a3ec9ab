"""Sampling in the target's graph (Target.attach_sampler, patch 0011) on tiny GGUFs.

Each output row's token is drawn in the graph with the key of the position it is drawn for, so
(1) the backend's draws equal the host twin ``sample_row`` on the same logits, row by row, for the
prefill's last row, a plain chain and a tree; (2) plain and speculative decoding with one seed emit
identical tokens whatever the draft shape and budget (the CPU's one-row and batched logits agree
bit for bit here); (3) the engine's backend and host paths give the same output.
"""
import numpy as np
import pytest

from tfm_local.decode.sampling import SamplingParams, draw_key, sample_row
from tfm_local.decode.verify import Target
from tfm_local.engine import Engine
from tfm_local.llama import native
from tfm_local.llama.model import gpu_available

from test_engine import PROMPTS, OracleDrafter, models  # noqa: F401  (fixtures)

SETTINGS = [SamplingParams(temperature=0.7, top_p=0.95, seed=7),
            SamplingParams(temperature=1.0, seed=11),
            SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=3)]


class Steered(OracleDrafter):
    """The chain proposes the script with corruptions (OracleDrafter); trees get marginals that put the
    script's token near the top (often not first), so that drafts of every shape get accepted."""

    def marginals(self, last_token, pos, n_draft):
        real = np.array(self.inner.marginals(last_token, pos, n_draft))
        for i in range(n_draft):
            j = pos - self.prompt_len + 1 + i
            if 0 <= j < len(self.script):
                real[i, self.script[j]] = real[i].max() + self.rng.normal(0, 1) - 0.3
        return real


def run_ids(engine, prompt, n, sp):
    return [t for t in engine.generate_ids(engine.prompt_tokens(prompt), n, sp)]


@pytest.mark.parametrize("sp", SETTINGS, ids=["t0.7-p0.95", "t1", "k40-p0.95-min0.05"])
def test_target_draws_equal_the_host_twin(models, sp):
    """prefill_choice and verify(backend_choice=True) return sample_row of each row with its position's key."""
    t = Target(models["target"], n_ctx=256, n_batch=32, n_threads=1)
    ref = Target(models["target"], n_ctx=256, n_batch=32, n_threads=1)
    try:
        prompt = t.tok.encode(PROMPTS[0])
        assert t.attach_sampler(sp, 99, 16)
        first = t.prefill_choice(prompt)
        x = np.array(ref.prefill(prompt))
        assert first == sample_row(x, sp, draw_key(99, len(prompt)))[0]
        parents = np.array([-1, 0, 0, 1, 1, 3, 2])
        tokens = np.array([first, 5, 9, 11, 12, 40, 41])
        for par in (None, parents):                      # a plain chain, then a tree
            toks = tokens[:4] if par is None else tokens
            got = t.verify(toks, par, backend_choice=True)
            want = ref.verify(toks, par)
            assert list(got.draw_pos) == list(want.draw_pos)
            for node in range(len(toks)):
                key = draw_key(99, int(want.draw_pos[node]))
                assert got.ids[node] == sample_row(np.array(want.logits[node]), sp, key)[0], node
            with pytest.raises(native.NativeError):     # one draw per output row, no more (no padding row)
                native.sample_get(t.ctx.ptr, 0, len(toks) + 1)
            t.commit([])
            ref.commit([])
    finally:
        t.close()
        ref.close()


@pytest.mark.parametrize("sp", SETTINGS[:2], ids=["t0.7-p0.95", "t1"])
def test_plain_and_speculative_sampling_are_identical(models, sp):
    """One seed: plain decoding and every draft shape (oracle drafts, so that drafts get accepted)
    emit the same tokens."""
    if gpu_available():
        pytest.skip("CUDA's batched and one-row kernels differ numerically (see tests/test_tree_verify.py)")
    with Engine(models["target"], None, n_ctx=512) as plain:
        refs = [run_ids(plain, p, 40, sp) for p in PROMPTS]
    for tree, budget in (("chain", 4), ("ddtree", 12), ("wide", 8), ("ddtree", "auto")):
        with Engine(models["target"], models["drafter"], n_ctx=512, tree=tree, budget=budget) as e:
            assert e.target.attach_sampler(sp, 1, 1)            # the backend path is the one tested
            for prompt, ref in zip(PROMPTS, refs):
                real = e.drafter
                e.drafter = Steered(real, len(e.prompt_tokens(prompt)), ref, 0.25)
                try:
                    assert run_ids(e, prompt, 40, sp) == ref, (tree, budget, prompt)
                finally:
                    e.drafter = real
                if budget != "auto":
                    assert e.stats.n_drafted > 0 and e.stats.tau > 1.2


def test_backend_and_host_paths_agree(models):
    """The engine's draws in the graph equal its host path's (a backend without the op)."""
    sp = SETTINGS[0]
    with Engine(models["target"], models["drafter"], n_ctx=512, budget=6) as e:
        backend = [run_ids(e, p, 32, sp) for p in PROMPTS]
        assert e.target.choice_rows > 0
        e.target._draw.unsupported = True                # as if the backend refused the op
        e.target.detach_choice()
        host = [run_ids(e, p, 32, sp) for p in PROMPTS]
        assert e.target.choice_rows == 0
    assert backend == host


def test_a_top_k_beyond_the_vocabulary_is_off(models):
    """top_k >= n_vocab (even beyond int32) keeps every token, as top_k = 0."""
    with Engine(models["target"], None, n_ctx=256) as e:
        a = run_ids(e, PROMPTS[0], 12, SamplingParams(temperature=1.0, top_k=10 ** 30, seed=4))
        assert a == run_ids(e, PROMPTS[0], 12, SamplingParams(temperature=1.0, seed=4))


def test_seed_none_draws_a_fresh_seed(models):
    with Engine(models["target"], None, n_ctx=256) as e:
        outs = {tuple(run_ids(e, PROMPTS[2], 12, SamplingParams(temperature=1.5))) for _ in range(4)}
    assert len(outs) > 1


def test_a_new_seed_is_set_in_place(models, monkeypatch):
    """A request with another seed (or none: a random one each) changes only the draws' keys: no
    re-attach (llama.cpp would re-reserve its scheduler), and the tokens are those of a fresh engine
    with that seed; other settings still re-attach."""
    attaches = []
    real_attach = native.sample_attach
    monkeypatch.setattr(native, "sample_attach", lambda *a, **k: attaches.append(a[1:6]) or real_attach(*a, **k))
    seeds = [5, 123456789, 2 ** 64 - 1]
    with Engine(models["target"], None, n_ctx=256) as e:
        got = [run_ids(e, PROMPTS[1], 12, SamplingParams(temperature=0.9, seed=s)) for s in seeds]
        assert len(attaches) == 1
        run_ids(e, PROMPTS[1], 4, SamplingParams(temperature=0.9, top_p=0.5, seed=5))
        assert len(attaches) == 2
    for s, g in zip(seeds, got):
        with Engine(models["target"], None, n_ctx=256) as fresh:
            assert run_ids(fresh, PROMPTS[1], 12, SamplingParams(temperature=0.9, seed=s)) == g
    assert len({tuple(g) for g in got}) > 1


def test_set_seed_needs_an_attached_sampler(models):
    t = Target(models["target"], n_ctx=64, n_batch=16, n_threads=1)
    try:
        with pytest.raises(native.NativeError):
            native.sample_set_seed(t.ctx.ptr, 3)
        with pytest.raises(ValueError):
            native.sample_set_seed(t.ctx.ptr, -1)
    finally:
        t.close()


def test_choosers_attach_for_the_most_rows_seen(models, monkeypatch):
    """Greedy and sampled requests and draft shapes alternating on one engine re-attach the target's
    backend chooser only when its kind or settings change, never for fewer rows than an earlier
    request had (each attach costs llama.cpp a scheduler reserve)."""
    rows = []
    real_topk, real_sample = native.topk_attach, native.sample_attach

    def topk(ctx, k, n_rows=1):
        if k:
            rows.append((ctx, "argmax", n_rows))
        return real_topk(ctx, k, n_rows)
    monkeypatch.setattr(native, "topk_attach", topk)
    monkeypatch.setattr(native, "sample_attach", lambda ctx, *a: rows.append((ctx, "draw", a[-1])) or real_sample(ctx, *a))
    greedy, warm = SamplingParams(), SamplingParams(temperature=0.8, seed=1)
    with Engine(models["target"], models["drafter"], n_ctx=512, tree="ddtree", budget=12,
                greedy_argmax="backend") as e:
        run_ids(e, PROMPTS[0], 6, greedy)
        e.set_budget(0)                     # plain decoding: one row a batch
        run_ids(e, PROMPTS[0], 6, warm)
        run_ids(e, PROMPTS[0], 6, greedy)
        e.set_budget(12)
        run_ids(e, PROMPTS[0], 6, greedy)   # the tree again: nothing to re-attach
        target = [(kind, n) for ctx, kind, n in rows if ctx == e.target.ctx.ptr]
    assert target == [("argmax", 13), ("draw", 13), ("argmax", 13)], target


def test_a_refused_sampler_leaves_raw_logits(models):
    """On a backend that runs the argmax but refused the token sampler (remembered), asking for the
    sampler again detaches the argmax, so that the host path reads this batch's raw logits (with the
    argmax left attached llama.cpp stopped copying them: the host read a stale batch's)."""
    t = Target(models["target"], n_ctx=256, n_batch=32, n_threads=1)
    ref = Target(models["target"], n_ctx=256, n_batch=32, n_threads=1)
    try:
        p, q = t.tok.encode(PROMPTS[0]), t.tok.encode(PROMPTS[1])
        want = np.array(ref.prefill(q))
        t._draw.unsupported = True
        assert t.attach_argmax(4)
        t.prefill_choice(p)
        assert not t.attach_sampler(SETTINGS[0], 1, 1) and not t.choice_rows
        np.testing.assert_array_equal(np.array(t.prefill(q)), want)
    finally:
        t.close()
        ref.close()


def test_a_seed_set_on_a_sampler_replaced_behind_its_back_attaches_anew(models):
    """If the context's sampler was replaced without the Target knowing (a direct topk_attach), a new
    seed falls back to a whole attach instead of failing."""
    t = Target(models["target"], n_ctx=256, n_batch=32, n_threads=1)
    ref = Target(models["target"], n_ctx=256, n_batch=32, n_threads=1)
    try:
        p = t.tok.encode(PROMPTS[0])
        assert t.attach_sampler(SETTINGS[0], 1, 4)
        native.topk_attach(t.ctx.ptr, 1, 4)
        assert t.attach_sampler(SETTINGS[0], 2, 4)
        first = t.prefill_choice(p)
        assert first == sample_row(np.array(ref.prefill(p)), SETTINGS[0], draw_key(2, len(p)))[0]
    finally:
        t.close()
        ref.close()
