"""The prompt cache (tfm_local/decode/prompt_cache.py) on tiny synthetic GGUFs: a warm engine (the caches
of its last generation kept) generates what a cold one (``prompt_cache=False``) does, greedy and seeded
sampled, plain and speculative (the chain, DDTree), for prompts that extend the cached tokens, share a
prefix, diverge at token 0, or are shorter; the tokens it keeps are counted independently of its own
statistics (the tokens the target decodes); a recurrent (Gated DeltaNet) target keeps its cache only in
the exact-prefix case; a sliding-window target only while the window before the cut is held; the plan's
rules one by one on stand-in caches.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from tfm_local.decode.prompt_cache import PromptCache, Reuse, common_prefix
from tfm_local.decode.sampling import SamplingParams
from tfm_local.engine import Engine
from tfm_local.lossless import SMALL_BATCH_ROWS, small_batch_exact
from tfm_local.testing.synth import write_tiny_target

GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
TEXT = "the quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun all day long"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp("prompt-cache")
    target = write_tiny_target(d / "target.gguf", n_layer=3, n_embd=64, seed=2)
    drafter, _ = init_random(target, d / "drafter.gguf", layers=1, seed=6)
    return target, drafter


def run(engine, ids, n, sp):
    return list(engine.generate_ids(list(ids), n, sp))


class DecodeCounter:
    """Counts the tokens the target's context decodes (wraps ``ctx.decode_tokens``), for the prefill."""

    def __init__(self, engine):
        self.ctx, self.n = engine.target.ctx, 0
        self.real = self.ctx.decode_tokens

        def counted(tokens, *a, **kw):
            self.n += len(tokens)
            return self.real(tokens, *a, **kw)

        self.ctx.decode_tokens = counted

    def close(self):
        self.ctx.decode_tokens = self.real


def prefill_only(engine, ids, sp) -> tuple[list[int], int]:
    """A one-token generation (the prefill alone): its token and the tokens the target decoded for it."""
    counter = DecodeCounter(engine)
    try:
        return run(engine, ids, 1, sp), counter.n
    finally:
        counter.close()


def cases(engine, first: list[int], out: list[int]):
    """(what, prompt ids, tokens the cache keeps) for the prompt cases, each against the cache the previous
    case's generation left (``last``: the tokens it holds), sent back by the caller."""
    more = engine.prompt_tokens("and a second question about the fox")[1:]
    last = yield "extension", first + out + more, len(first) + len(out) - 1  # a follow-up turn
    rng = np.random.default_rng(0)
    tail = [int(t) for t in rng.integers(3, 200, 9)]
    tail[0] = tail[0] if tail[0] != last[12] else last[12] + 1  # parts from the cache at token 12
    last = yield "shared prefix", last[:12] + tail, 12
    last = yield "diverges at 0", [5 if last[0] != 5 else 6] + last[1:20], 0
    last = yield "shorter", last[:len(last) - 3], len(last) - 4
    yield "repeat", last, len(last) - 1


@pytest.mark.parametrize("mode", ["plain", "chain", "ddtree"])
@pytest.mark.parametrize("sp", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_warm_engine_equals_cold_engine(pair, mode, sp):
    """Every case: the warm engine's output equals the cold engine's, it keeps exactly the common prefix
    (at most all but the last prompt token), the target decodes only the rest (counted at its context),
    and the caches stay consistent (``state_problems``)."""
    target, drafter = pair
    kw = dict(n_ctx=512) if mode == "plain" else dict(n_ctx=512, budget=None if mode == "chain" else 12, tree=mode)
    dft = None if mode == "plain" else drafter
    warm, cold = Engine(target, dft, **kw), Engine(target, dft, prompt_cache=False, **kw)
    try:
        first = warm.prompt_tokens(TEXT)
        out = run(warm, first, 24, sp)
        assert warm.stats.n_cached == 0 and out == run(cold, first, 24, sp)
        gen = cases(warm, first, out)
        what, ids, keep = next(gen)
        while True:
            got, decoded = prefill_only(warm, ids, sp)
            assert (what, warm.stats.n_cached, decoded) == (what, keep, len(ids) - keep)
            assert got == run(cold, ids, 1, sp) and cold.stats.n_cached == 0
            got = run(warm, ids, 20, sp)  # the whole generation: a repeat of the 1-token run's prompt
            assert (what, got) == (what, run(cold, ids, 20, sp))
            assert warm.stats.n_cached == len(ids) - 1 and warm.state_problems() == []
            try:
                what, ids, keep = gen.send(ids + got[:-1])  # what the target's cache holds now
            except StopIteration:
                break
    finally:
        warm.close()
        cold.close()


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "gemm"])
def test_a_warm_cache_holds_a_cold_prefills_bits(pair, exact):
    """Prefilled in exact small passes (``Target.prefill_rows``: the CPU and F32 weights), the cache a
    conversation left (its prompt prefilled, its answer verified in 16-node chains and cut back) holds the
    bits a cold prefill of the same tokens writes: a follow-up's logits after a warm prefill equal a cold
    prefill's bit for bit. In chunks of n_batch (``exact_prefill=False``) the same tokens take one GEMM,
    and the logits only come close (they differ here by up to ~0.02)."""
    target, drafter = pair
    with Engine(target, drafter, n_ctx=512, budget=None) as e:
        assert small_batch_exact(e.target.model) and e.target.prefill_rows == SMALL_BATCH_ROWS
        if not exact:
            e.target.prefill_rows = e.target.n_batch
        first = e.prompt_tokens(TEXT + " " + TEXT)
        assert len(first) > 2 * SMALL_BATCH_ROWS  # several prefill passes
        out = run(e, first, 40, GREEDY)
        assert e.stats.n_drafted >= 10 * e.stats.n_steps  # verified in chains of many nodes
        follow = first + out + e.prompt_tokens("and a second question about the fox")[1:]
        warm = e.target.prefill(follow, keep=e.target.n_past).copy()
        cold = e.target.prefill(follow).copy()
        if exact:
            assert np.array_equal(warm, cold)
        else:  # the exact case is not vacuous: these splits do compute other bits
            assert not np.array_equal(warm, cold)
            np.testing.assert_allclose(warm, cold, atol=0.1)


@pytest.mark.parametrize("sp", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_automatic_budget_warm_equals_cold(pair, sp):
    """The automatic budget (its plain stretches leave holes in the drafter's rows, which limit what a
    capturing prefill keeps): every case's output equals a cold engine's, the kept tokens are at most the
    common prefix, the target decodes exactly the rest, and the caches stay consistent."""
    target, drafter = pair
    warm, cold = Engine(target, drafter, n_ctx=512), Engine(target, drafter, n_ctx=512, prompt_cache=False)
    try:
        first = warm.prompt_tokens(TEXT)
        out = run(warm, first, 24, sp)
        assert out == run(cold, first, 24, sp)
        gen = cases(warm, first, out)
        what, ids, keep = next(gen)
        kept = 0
        while True:
            got, decoded = prefill_only(warm, ids, sp)
            n = warm.stats.n_cached
            assert n <= keep and decoded == len(ids) - n and got == run(cold, ids, 1, sp), what
            kept += n
            got = run(warm, ids, 20, sp)
            assert got == run(cold, ids, 20, sp) and warm.state_problems() == [], what
            assert warm.stats.n_cached <= len(ids) - 1
            try:
                what, ids, keep = gen.send(ids + got[:-1])
            except StopIteration:
                break
        assert kept > 0  # the cache kept something over the cases
    finally:
        warm.close()
        cold.close()


def test_disabled_cache_prefills_everything(pair):
    """``prompt_cache=False`` and ``engine.prompt_cache.enabled = False``: every prompt from position 0."""
    target, _ = pair
    with Engine(target, None, n_ctx=256, prompt_cache=False) as e:
        ids = e.prompt_tokens(TEXT)
        run(e, ids, 8, GREEDY)
        assert prefill_only(e, ids, GREEDY)[1] == len(ids) and e.stats.n_cached == 0
    with Engine(target, None, n_ctx=256) as e:
        run(e, ids, 8, GREEDY)
        assert prefill_only(e, ids, GREEDY)[1] == 1 and e.stats.n_cached == len(ids) - 1
        e.prompt_cache.enabled = False
        assert prefill_only(e, ids, GREEDY)[1] == len(ids) and e.stats.n_cached == 0
        assert e.stats.n_prefilled == len(ids)


def test_writes_outside_a_generation_void_the_record(pair):
    """A prefill, a cut or a stopped-midway generation between two generations: the next one is cold and
    still right."""
    target, drafter = pair
    with Engine(target, drafter, n_ctx=256, budget=None) as e, \
            Engine(target, drafter, n_ctx=256, budget=None, prompt_cache=False) as cold:
        ids = e.prompt_tokens(TEXT)
        ref = run(cold, ids, 16, GREEDY)
        assert run(e, ids, 16, GREEDY) == ref
        e.target.prefill(e.prompt_tokens("something else entirely"))  # the cache holds other tokens now
        assert run(e, ids, 16, GREEDY) == ref and e.stats.n_cached == 0
        e.drafter.marginals(ref[-1], e.target.n_past, 4)  # a drafter pass outside a generation
        assert run(e, ids, 16, GREEDY) == ref and e.stats.n_cached == 0
        assert run(e, ids, 16, GREEDY) == ref and e.stats.n_cached == len(ids) - 1
        it = e.generate_ids(ids, 16, GREEDY)
        next(it)
        it.close()  # stopped at a token: the caches are consistent and kept
        assert run(e, ids, 16, GREEDY) == ref and e.stats.n_cached == len(ids) - 1


def test_an_abandoned_generation_does_not_overwrite_the_record(pair):
    """A generation left unfinished while another runs, closed afterwards: its caches are gone, and the
    record stays the later generation's."""
    target, _ = pair
    with Engine(target, None, n_ctx=256) as e, Engine(target, None, n_ctx=256, prompt_cache=False) as cold:
        a, b = e.prompt_tokens(TEXT), e.prompt_tokens("a different prompt with other words in it")
        old = e.generate_ids(a, 16, GREEDY)
        next(old)
        ref = run(cold, b, 16, GREEDY)
        assert run(e, b, 16, GREEDY) == ref
        old.close()
        assert run(e, b, 16, GREEDY) == ref and e.stats.n_cached == len(b) - 1


def test_the_drafter_limits_what_a_capturing_prefill_keeps(pair):
    """A drafter holding the features of fewer tokens than the target (rows cut back, as after a plain
    stretch without capture): a generation that captures the prompt keeps only what the drafter holds (its
    rows after the prefill are every prompt token's, as a cold prefill's); one that does not (drafter idle)
    keeps the target's whole prefix and cuts the drafter's rows to it."""
    target, drafter = pair
    with Engine(target, drafter, n_ctx=256, budget=None) as e, \
            Engine(target, drafter, n_ctx=256, budget=None, prompt_cache=False) as cold:
        ids = e.prompt_tokens(TEXT)
        out = run(e, ids, 16, GREEDY)
        held = ids + out[:-1]
        e.drafter.keep(5)
        e.prompt_cache.remember(e.target, e.drafter, held)  # the engine's record of the caches as they are
        ext = ids + out + [7, 8, 9]
        assert run(e, ext, 12, GREEDY) == run(cold, ext, 12, GREEDY)
        assert e.stats.n_cached == 5 and e.state_problems() == []
        assert e.drafter.rows_in_place == e.drafter.n_injected + e.drafter.pending >= len(ext)  # no hole
        e.drafter.keep(5)
        e.prompt_cache.remember(e.target, e.drafter, e.prompt_cache.cached_ids)
        e.set_budget(0)  # the drafter idle: nothing captured
        again = list(e.prompt_cache.cached_ids) + [11, 12]
        assert run(e, again, 8, GREEDY) == run(cold, again, 8, GREEDY)
        assert e.stats.n_cached == len(again) - 2 and e.drafter.n_injected == 5


# -- recurrent and sliding-window targets ----------------------------------------------------
@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp("prompt-cache-hybrid")
    target = write_tiny_target(d / "qwen35.gguf", arch="qwen35", n_layer=4, n_embd=64, seed=7)
    drafter, _ = init_random(target, d / "drafter.gguf", layers=1, seed=3)
    return target, drafter


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "ddtree"])
def test_a_recurrent_target_keeps_its_cache_only_for_an_exact_prefix(hybrid, speculative):
    """Gated DeltaNet: the cache is kept when the cached tokens are a strict prefix of the new prompt
    (n_cached = all of them); a prompt that shares only part of them, or repeats them exactly (the last
    token would have to be decoded again), is prefilled cold. Outputs equal a cold engine's either way."""
    from test_tree_verify import assert_greedy_same_or_near_tie

    target, drafter = hybrid
    kw = dict(n_ctx=512, budget=12, tree="ddtree") if speculative else dict(n_ctx=512)
    dft = drafter if speculative else None
    warm, cold = Engine(target, dft, **kw), Engine(target, dft, prompt_cache=False, **kw)
    try:
        assert warm.target.recurrent
        ids = warm.prompt_tokens(TEXT)
        out = run(warm, ids, 16, GREEDY)
        held = ids + out[:-1]
        for ids2, keep in ((ids + out + [5, 6, 7], len(held)),  # extends the cache: kept
                           (held[:10] + [5, 6, 7, 8], 0),       # shares a part: cold
                           (None, 0)):                           # repeats the cache: cold
            ids2 = held if ids2 is None else ids2
            got = run(warm, ids2, 16, GREEDY)
            assert warm.stats.n_cached == keep and warm.state_problems() == []
            assert_greedy_same_or_near_tie(target, ids2, got, run(cold, ids2, 16, GREEDY))
            held = ids2 + got[:-1]
    finally:
        warm.close()
        cold.close()


def test_a_sliding_window_target_keeps_its_cache(tmp_path):
    """gemma3 with a 4-token window (full-size window caches, as every context of the project keeps): a
    follow-up right after the cached tokens keeps them all, a cut deep in a long sequence keeps the prefix
    too. Outputs equal a cold engine's."""
    path = write_tiny_target(tmp_path / "gemma3.gguf", arch="gemma3", n_layer=3, n_swa=4)
    with Engine(path, None, n_ctx=2048) as warm, Engine(path, None, n_ctx=2048, prompt_cache=False) as cold:
        assert warm.target.ctx.n_swa == 4
        long = [int(t) for t in np.random.default_rng(1).integers(3, 200, 1000)]
        out = run(warm, long, 8, GREEDY)
        ids = long + out + [9, 10]
        assert run(warm, ids, 8, GREEDY) == run(cold, ids, 8, GREEDY)
        assert warm.stats.n_cached == len(long) + len(out) - 1 and warm.state_problems() == []
        ids = ids[:100] + [5, 6, 7]
        assert run(warm, ids, 8, GREEDY) == run(cold, ids, 8, GREEDY)
        assert warm.stats.n_cached == 100 and warm.state_problems() == []


def test_a_window_cache_that_reused_its_cells_cannot_resume_before_them(tmp_path):
    """A context with window-sized caches (``swa_full=False``: about one window and one batch of cells,
    reused once out of the window): after 1000 tokens the window before position 100 is gone, so a cut
    there is not resumable (the prompt cache then prefills cold); a cut near the end is."""
    from tfm_local.llama.model import Context, Model

    model = Model(write_tiny_target(tmp_path / "gemma3.gguf", arch="gemma3", n_layer=3, n_swa=4), n_gpu_layers=0)
    ctx = Context(model, n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=1, swa_full=False)
    try:
        ids = [int(t) for t in np.random.default_rng(1).integers(3, 200, 1000)]
        for s in range(0, len(ids), 512):
            ctx.decode_tokens(ids[s:s + 512], s, "last")
        assert ctx.pos_max() == 999 and ctx.pos_min() > 100 - 4
        assert not ctx.resumable_at(100) and ctx.resumable_at(990) and ctx.resumable_at(0)
        assert not ctx.resumable_at(1001)  # past what it holds
    finally:
        ctx.close()
        model.close()


# -- the plan's rules on stand-in caches ------------------------------------------------------
def fake_caches(n_past=20, recurrent=False, rows=20, resumable=lambda n: True, d_resumable=lambda n: True):
    target = SimpleNamespace(n_past=n_past, recurrent=recurrent,
                             ctx=SimpleNamespace(writes=1, resumable_at=resumable))
    drafter = SimpleNamespace(rows_in_place=rows, ctx=SimpleNamespace(writes=1),
                              can_keep=lambda n: n <= rows and d_resumable(n))
    return target, drafter


def planned(ids, prompt, capture=True, enabled=True, **kw) -> Reuse:
    target, drafter = fake_caches(n_past=len(ids), **kw)
    cache = PromptCache(enabled)
    cache.remember(target, drafter, ids)
    return cache.plan(target, drafter, prompt, capture)


def test_plan_rules():
    held = list(range(3, 23))  # 20 tokens
    assert planned(held, held + [1, 2]) == Reuse(20, 20)
    assert planned(held, held) == Reuse(19, 19)                        # the last token decoded again
    assert planned(held, held[:8]) == Reuse(7, 7)
    assert planned(held, held[:8] + [1]) == Reuse(8, 8)
    assert planned(held, [1] + held) == Reuse()                       # diverges at token 0
    assert planned(held, held + [1], enabled=False) == Reuse()
    # the drafter holds fewer rows: a capturing prefill keeps what it holds, another keeps the target's
    assert planned(held, held + [1], rows=6) == Reuse(6, 6)
    assert planned(held, held + [1], rows=6, capture=False) == Reuse(20, 6)
    assert planned(held, held + [1], rows=6, capture=False, d_resumable=lambda n: n == 0) == Reuse(20, 0)
    # recurrent: only the exact prefix
    assert planned(held, held + [1], recurrent=True) == Reuse(20, 20)
    assert planned(held, held[:10] + [1], recurrent=True) == Reuse()
    assert planned(held, held, recurrent=True) == Reuse()
    assert planned(held, held + [1], recurrent=True, rows=6) == Reuse()
    assert planned(held, held + [1], recurrent=True, rows=6, capture=False) == Reuse(20, 6)
    # a sliding window no longer held
    assert planned(held, held + [1], resumable=lambda n: n >= 25) == Reuse()


def test_plan_forgets_and_checks_the_caches():
    held = list(range(3, 23))
    target, drafter = fake_caches()
    cache = PromptCache()
    assert cache.plan(target, drafter, held, True) == Reuse()  # nothing remembered
    cache.remember(target, drafter, held)
    assert cache.cached_ids == tuple(held)
    assert cache.plan(target, drafter, held + [1], True) == Reuse(20, 20)
    assert cache.plan(target, drafter, held + [1], True) == Reuse()  # a plan forgets the record
    for who in ("target", "drafter"):
        cache.remember(target, drafter, held)
        (target if who == "target" else drafter).ctx.writes += 1  # someone wrote to a cache since
        assert cache.plan(target, drafter, held + [1], True) == Reuse(), who
    cache.remember(target, drafter, held)
    target.n_past = 5
    assert cache.plan(target, drafter, held + [1], True) == Reuse()
    with pytest.raises(ValueError, match="holds 5 tokens"):
        cache.remember(target, drafter, held)


def test_common_prefix():
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1
    assert common_prefix(np.array([4, 2]), [5, 2]) == 0


# -- tfm-bench cache -----------------------------------------------------------------------------
def test_bench_cache_measures_a_follow_up_and_a_repeated_request(pair, tmp_path):
    """tfm-bench cache on the tiny pair: a conversation of 200 tokens, follow-ups warm and cold (greedy and
    seeded), the repeated request through the server's app; its JSON holds the counts, the verdicts and
    the provenance (the times of tiny models are not judged here)."""
    import json

    from tfm_local.bench.prompt_cache import main
    from tfm_local.bench.provenance import problems

    target, drafter = pair
    out = tmp_path / "cache.json"
    main(["--target", str(target), "--drafter", str(drafter), "--budget", "8", "--n-ctx", "1024",
          "--conversation-tokens", "200", "--answer-tokens", "24", "--followup-tokens", "8", "--sets", "humaneval",
          "--threads", "1", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert problems(doc["provenance"], ["target", "drafter"]) == []
    assert [r["sampling"] for r in doc["runs"]] == ["greedy", "t=0.8"]
    for r in doc["runs"]:
        w, c = r["warm"], r["cold"]
        assert w["n_prompt"] == c["n_prompt"] >= 200 and c["n_cached"] == 0 and c["n_prefilled"] == c["n_prompt"]
        # the cache holds the answered turn's prompt and answer: the follow-up keeps at least that prompt
        assert w["n_cached"] + w["n_prefilled"] == w["n_prompt"] and w["n_cached"] >= r["answered"]["n_prompt"]
        assert r["equal"] and r["prefill_ratio"] == w["n_prefilled"] / c["n_prefilled"]
    rep = doc["repeat"]
    assert rep["cached_tokens"] == rep["prompt_tokens"] - 1 and rep["equal"]
    assert doc["bar"]["outputs_equal"] and doc["bar"]["repeat_cached_ratio"]
