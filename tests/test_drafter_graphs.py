"""Patch 0010: the drafter keeps its injection and block-pass graphs (tiny synthetic GGUFs).

A drafter step decodes an injection batch (no outputs) and then the block pass (every row an
output) on one context. Without the patch's second scheduler llama.cpp reuses neither graph (a
graph is reused only if its scheduler allocated nothing since); with it (``native.keep_graphs``,
on by default in DFlashDrafter) the block pass is reused every step, the injection whenever its
row count repeats. Results must not change: a drafter with the switch on is compared with one
with the switch off, fed the same injections (one thread each: the same graphs compute the same
floats), also across what invalidates kept graphs (a cache clear or truncation, a scheduler
reserve from re-attaching the top-k sampler, a detach by ``marginals``, toggling the switch).
"""
import numpy as np
import pytest

from tfm_local.llama import native
from tfm_local.decode.draft import DFlashDrafter
from tfm_local.engine import Engine
from tfm_local.decode.sampling import SamplingParams
from tfm_local.decode.verify import Target

from test_drafter_topk import PROMPT, advance, paths  # noqa: F401  (paths: the tiny GGUF pair fixture)


@pytest.fixture
def trio(paths):
    """A target, a drafter with kept graphs (the default) and one without (keep_graphs=False),
    both fed the prompt's features."""
    tgt = Target(paths[0], n_ctx=256, n_batch=64, n_threads=1)
    on = DFlashDrafter(paths[1], tgt, n_threads=1)
    off = DFlashDrafter(paths[1], tgt, n_threads=1, keep_graphs=False)

    def inject(s, n):
        feats = tgt.features(slice(0, n), n)
        on.inject(feats, s)
        off.inject(feats, s)

    tgt.prefill(PROMPT, inject)
    yield tgt, on, off
    on.close()
    off.close()
    tgt.close()


def reused(dft) -> int:
    return native.graphs_reused(dft.ctx.ptr)


def same_top_k(a, b, last, pos, n_draft, k):
    """top_k of both drafters: identical ids and log-probs; returns the first's."""
    ga, gb = a.top_k(last, pos, n_draft, k), b.top_k(last, pos, n_draft, k)
    np.testing.assert_array_equal(ga[0], gb[0])
    np.testing.assert_array_equal(ga[1], gb[1])
    return ga


def test_switch_defaults_on_and_env_turns_it_off(trio):
    _, on, off = trio
    assert on.keep_graphs is True and off.keep_graphs is False
    assert native.keep_graphs(off.ctx.ptr, False)  # asking for the current state is a no-op


def test_block_pass_graph_is_reused_and_results_unchanged(trio):
    """Each step: one block pass, then 2 rows injected. With the switch on every block pass after the
    first reuses its graph (and each injection of a row count already seen right before), with it off
    none does; top-k ids and log-probs are bit-identical."""
    tgt, on, off = trio
    last = int(PROMPT[-1])
    same_top_k(on, off, last, tgt.n_past, 15, 8)  # attaches the sampler: the reserve is behind us
    r_on, r_off = reused(on), reused(off)
    block_reuses = 0
    for step in range(8):
        pos = tgt.n_past
        before = reused(on)
        got = same_top_k(on, off, last, pos, 15, 8)
        block_reuses += reused(on) - before
        last = advance(tgt, [on, off], last, got[0][:, 0], n_accept=1)  # 2 rows injected every step
    assert block_reuses == 8, "every block pass should reuse the kept graph"
    # the first 2-row injection follows the prompt's 12 rows (a rebuild); the 7 after it reuse it
    assert reused(on) - r_on == 8 + 7, "the 2-row injections should reuse theirs too"
    # without the switch the only reuse is step 0's block pass, right after the first (no injection between)
    assert reused(off) - r_off == 1, "without the switch llama.cpp reuses neither graph"


def test_marginals_and_varying_shapes_match(trio):
    """Block sizes and injection sizes that change every step (rebuilds in both schedulers), and
    ``marginals`` (full logits, sampler detached: a reserve) between backend top-k passes."""
    tgt, on, off = trio
    last = int(PROMPT[-1])
    for step, n_draft in enumerate([15, 4, 15, 1, 9, 15, 15, 7]):
        pos = tgt.n_past
        if step % 3 == 2:
            np.testing.assert_array_equal(on.marginals(last, pos, n_draft), off.marginals(last, pos, n_draft))
        got = same_top_k(on, off, last, pos, n_draft, 8 if step % 4 else 64)
        last = advance(tgt, [on, off], last, got[0][:, 0], n_accept=step % 4)


def test_results_after_invalidations(trio):
    """Clearing and rebuilding the cache, truncating it (rewind), re-attaching the sampler with a
    larger k and toggling the switch: kept graphs must never be reused stale."""
    tgt, on, off = trio
    last, pos = int(PROMPT[-1]), tgt.n_past
    for _ in range(2):  # graphs kept in both schedulers
        same_top_k(on, off, last, pos, 15, 8)
        last = advance(tgt, [on, off], last, [5], n_accept=1)
        pos = tgt.n_past

    # start over: a fresh prefill re-reads the prompt's features, the drafters' caches are cleared
    n = len(PROMPT)
    tgt.prefill(PROMPT)
    feats = tgt.features(slice(0, n), n).copy()
    for d in (on, off):
        d.reset()
        d.inject(feats[:2], 0)  # the row count of the last injection: its kept graph, over a cleared cache
        d.inject(feats[2:], 2)  # another row count: the injection graph is rebuilt in place
    last, pos = int(PROMPT[-1]), n
    same_top_k(on, off, last, pos, 15, 8)

    for d in (on, off):  # truncation below the block: re-inject the tail
        d.inject(feats[n - 3:], n - 3)
    same_top_k(on, off, last, pos, 15, 8)
    same_top_k(on, off, last, pos, 15, 100)  # larger k: re-attach, a scheduler reserve
    before = reused(on)
    same_top_k(on, off, last, pos, 15, 100)
    assert reused(on) == before + 1

    assert native.keep_graphs(on.ctx.ptr, False)
    same_top_k(on, off, last, pos, 15, 100)
    assert native.keep_graphs(on.ctx.ptr, True)
    for d in (on, off):
        d.inject(feats[n - 2:], n - 2)
    same_top_k(on, off, last, pos, 15, 100)
    for d in (on, off):
        d.inject(feats[n - 2:], n - 2)
    before = reused(on)
    same_top_k(on, off, last, pos, 15, 100)
    assert reused(on) == before + 1  # the 2-row injection was rebuilt, then the block reused


def test_engine_greedy_equals_plain_with_kept_graphs(paths):
    spec = Engine(paths[0], paths[1], n_ctx=512, budget=None)
    plain = Engine(paths[0], None, n_ctx=512)
    try:
        assert spec.drafter.keep_graphs
        before = reused(spec.drafter)
        for prompt in ["hello world, this is a test", "a b c d e f"]:
            ids = plain.prompt_tokens(prompt)
            assert list(spec.generate_ids(ids, 40, SamplingParams())) == list(plain.generate_ids(ids, 40, SamplingParams()))
            assert spec.stats.n_steps > 0
        assert reused(spec.drafter) - before >= spec.stats.n_steps
    finally:
        spec.close()
        plain.close()
