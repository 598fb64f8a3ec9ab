"""DFlashDrafter.top_k: backend top-K log-probabilities (our patch API) on tiny synthetic GGUFs.

The backend sampler computes, inside the drafter's ggml graph, the full-vocabulary
log-softmax and the top K of every block row; it must agree with the host
computation over the full logits (``top_k_logprobs(marginals(...))``), leave the
drafter's KV cache as a plain draft does, and survive inject/draft cycles,
changes of K and interleaved ``marginals`` calls.
"""
import numpy as np
import pytest

from tfm_local.llama import native
from tfm_local.decode.draft import TOP_K, DFlashDrafter
from tfm_local.decode.draft import top_k_logprobs
from tfm_local.decode.verify import Target

from tfm_local.testing.synth import write_tiny_target
from test_tree_verify import assert_rows_equal_or_close

PROMPT = [11, 42, 7, 99, 3, 250, 18, 64, 5, 120, 77, 31]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp("topk")
    target = write_tiny_target(d / "target.gguf", n_layer=3, n_embd=64, seed=7)
    # F32 weights: the CPU's 2..16-row products of F32 (like the quantized types', patch 0015) have the
    # bits of the 1-row product, so rows injected in one batch equal rows injected one by one; ggml's
    # F16 products do not promise that (a batched injection moved one F16 ulp of the drafter's cache)
    drafter, _ = init_random(target, d / "drafter.gguf", layers=1, seed=5, outtype="f32")
    return target, drafter


@pytest.fixture
def pair(paths):
    tgt = Target(paths[0], n_ctx=256, n_batch=64, n_threads=1)
    dft = DFlashDrafter(paths[1], tgt, n_threads=1)
    tgt.prefill(PROMPT, lambda s, n: dft.inject(tgt.features(slice(0, n), n), s))
    yield tgt, dft
    dft.close()
    tgt.close()


def advance(tgt, drafters, last: int, drafts, n_accept: int) -> int:
    """Verify ``[last, drafts[:n_accept]]`` on the target, commit it, inject its features into
    ``drafters`` (one or a list); returns the next root."""
    tokens = [int(last)] + [int(t) for t in drafts[:n_accept]]
    pos = tgt.n_past
    logits = tgt.verify(tokens).logits
    nxt = int(np.argmax(logits[-1]))
    tgt.commit(range(len(tokens)))
    feats = tgt.features(np.arange(len(tokens)), len(tokens))
    for d in drafters if isinstance(drafters, list) else [drafters]:
        d.inject(feats, pos)
    return nxt


def assert_same_top_k(marg, want, got):
    """Same log-probs (1e-4); ids equal except where the two differ only among exactly tied logits."""
    (wc, wl), (gc, gl) = want, got
    assert gc.shape == wc.shape and gl.shape == wl.shape
    assert gc.dtype == np.int64 and gl.dtype == np.float64
    np.testing.assert_allclose(gl, wl, atol=1e-4, rtol=0)
    assert np.all(np.diff(gl, axis=1) <= 0), "rows must be sorted by descending log-prob"
    rows, cols = np.nonzero(gc != wc)
    for r, c in zip(rows, cols):
        assert marg[r, gc[r, c]] == marg[r, wc[r, c]], f"row {r}: id {gc[r, c]} != {wc[r, c]} without a tie"


@pytest.mark.parametrize("k", [1, 8, 64])
def test_backend_top_k_equals_host_top_k_over_cycles(pair, k):
    tgt, dft = pair
    last = int(PROMPT[-1])
    for step, n_draft in enumerate([15, 4, 1, 9, 15, 7]):
        pos = tgt.n_past
        marg = np.array(dft.marginals(last, pos, n_draft))
        got = dft.top_k(last, pos, n_draft, k)
        assert_same_top_k(marg, top_k_logprobs(marg, k), got)
        last = advance(tgt, dft, last, got[0][:, 0], n_accept=step % 3)


def test_top_k_leaves_the_drafter_state_as_a_draft_does(pair):
    tgt, dft = pair
    last, pos = int(PROMPT[-1]), tgt.n_past
    fresh = np.array(dft.marginals(last, pos, 15))
    cells = dft.ctx.pos_max()
    dft.top_k(last, pos, 15, 8)
    assert dft.ctx.pos_max() == cells and dft.n_injected == pos
    np.testing.assert_array_equal(np.array(dft.marginals(last, pos, 15)), fresh)
    dft.top_k(last, pos, 6, 8)  # a shorter block leaves its own noise cells, dropped by the next pass
    np.testing.assert_array_equal(np.array(dft.marginals(last, pos, 15)), fresh)


def test_top_k_after_top_k_and_k_changes(pair, paths):
    """Consecutive backend passes (never detached), a larger k re-attaching, a smaller one slicing,
    chain = column 0; checked against a second drafter that gets the same injections."""
    tgt, dft = pair
    ref = DFlashDrafter(paths[1], tgt, n_threads=1)
    try:
        ref.inject(prompt_features(tgt), 0)
        assert dft._topk == 0  # attached by reset or the first top_k
        last = int(PROMPT[-1])
        for step, k in enumerate([8, 1, 64, 3, 64, 8]):
            pos = tgt.n_past
            got = dft.top_k(last, pos, 12, k)
            assert dft._topk == (TOP_K if step < 2 else 64)
            chain = dft.draft_chain(last, pos, 12)
            assert chain == [int(t) for t in got[0][:, 0]]
            marg = np.array(ref.marginals(last, pos, 12))
            assert_same_top_k(marg, top_k_logprobs(marg, k), got)
            last = advance(tgt, [dft, ref], last, chain, n_accept=1 + step % 2)
    finally:
        ref.close()


def prompt_features(tgt):
    """Layer features of PROMPT, re-decoded on the target (its cache is rebuilt the same way)."""
    n_past = tgt.n_past
    assert n_past == len(PROMPT)
    tgt.prefill(PROMPT)
    return tgt.features(slice(0, len(PROMPT)), len(PROMPT)).copy()


def test_full_vocabulary_top_k_is_a_distribution(pair):
    tgt, dft = pair
    n_vocab = tgt.model.n_vocab
    cand, logp = dft.top_k(int(PROMPT[-1]), tgt.n_past, 5, n_vocab)
    assert cand.shape == (5, n_vocab)
    assert all(sorted(row) == list(range(n_vocab)) for row in cand.tolist())
    np.testing.assert_allclose(np.exp(logp).sum(1), 1.0, atol=1e-5)


def test_bad_k_and_n_draft_raise(pair):
    tgt, dft = pair
    last, pos = int(PROMPT[-1]), tgt.n_past
    for k in (0, -1, tgt.model.n_vocab + 1):
        with pytest.raises(ValueError, match="k must be"):
            dft.top_k(last, pos, 4, k)
    for n in (0, dft.block_size):
        with pytest.raises(ValueError, match="n_draft"):
            dft.top_k(last, pos, n, 4)
    with pytest.raises(ValueError):
        native.topk_attach(dft.ctx.ptr, tgt.model.n_vocab + 1, dft.block_size)
    assert dft.top_k(last, pos, 4, 4)[0].shape == (4, 4)  # still usable


def test_host_fallback_when_the_backend_cannot_run_the_ops(paths, monkeypatch):
    monkeypatch.setattr(native, "topk_attach", lambda ctx, k, n_rows=1: k == 0)
    tgt = Target(paths[0], n_ctx=256, n_batch=64, n_threads=1)
    dft = DFlashDrafter(paths[1], tgt, n_threads=1)
    try:
        dft.reset()
        assert dft._topk is None  # refused, remembered: the host path from then on
        tgt.prefill(PROMPT, lambda s, n: dft.inject(tgt.features(slice(0, n), n), s))
        last, pos = int(PROMPT[-1]), tgt.n_past
        got = dft.top_k(last, pos, 10, 8)
        marg = np.array(dft.marginals(last, pos, 10))
        assert_same_top_k(marg, top_k_logprobs(marg, 8), got)
        assert dft.draft_chain(last, pos, 10) == [int(t) for t in np.argmax(marg, axis=1)]
    finally:
        dft.close()
        tgt.close()


def test_top_k_result_needs_an_attached_sampler(pair):
    """native.topk_get refuses rows it has no result for (no sampler, another k, a non-output row)."""
    tgt, dft = pair
    last, pos = int(PROMPT[-1]), tgt.n_past
    dft.marginals(last, pos, 4)  # detached
    with pytest.raises(native.NativeError):
        native.topk_get(dft.ctx.ptr, 1, 4, 8)
    dft.top_k(last, pos, 4, 8)
    with pytest.raises(native.NativeError):
        native.topk_get(dft.ctx.ptr, 1, 4, 5)
    with pytest.raises(native.NativeError):
        native.topk_get(dft.ctx.ptr, 1, 5, 8)  # the block had rows 0..4 only


def test_backend_pass_copies_no_full_logits(pair):
    """With the sampler attached, llama.cpp leaves the host logits buffer alone (only k ids + k floats per row)."""
    tgt, dft = pair
    last, pos = int(PROMPT[-1]), tgt.n_past
    dft.top_k(last, pos, 15, 8)  # sizes llama.cpp's output buffer for this block
    host = dft.ctx.logits(16)
    host[:] = 12345.0
    dft.top_k(last + 1, pos, 15, 8)
    assert (host == 12345.0).all()


def test_reset_attaches_and_marginals_detach(pair):
    """reset() attaches TOP_K (the reserve lands on the next prefill); marginals detaches; top_k re-attaches."""
    tgt, dft = pair
    dft.reset()
    assert dft._topk == TOP_K
    tgt.prefill(PROMPT, lambda s, n: dft.inject(tgt.features(slice(0, n), n), s))
    last, pos = int(PROMPT[-1]), tgt.n_past
    got = dft.top_k(last, pos, 9, 4)
    assert dft._topk == TOP_K
    marg = np.array(dft.marginals(last, pos, 9))
    assert dft._topk == 0
    assert_same_top_k(marg, top_k_logprobs(marg, 4), got)
    dft.reset()
    assert dft._topk == TOP_K


def test_deferred_rows_draft_like_eager_injection(paths):
    """Rows queued by ``defer`` (the auto budget's plain steps), after a draft left its noise block,
    give the same marginals as injecting each row at once (bitwise on the CPU; on CUDA the batched and
    one-row kernels round otherwise, ``assert_rows_equal_or_close``); a rewind drops queued rows."""
    tgt = Target(paths[0], n_ctx=256, n_batch=64, n_threads=1)
    eager, lazy = (DFlashDrafter(paths[1], tgt, n_threads=1) for _ in range(2))
    tgt.prefill(PROMPT, lambda s, n: [d.inject(tgt.features(slice(0, n), n), s) for d in (eager, lazy)])
    last = int(PROMPT[-1])
    lazy.marginals(last, tgt.n_past, 15)  # a noise block in the lazy drafter's cache
    for tok in [5, 17, 240, 3]:  # four plain steps
        pos = tgt.n_past
        tgt.verify([last])
        tgt.commit([0])
        rows = tgt.features(slice(0, 1), 1)
        eager.inject(rows, pos)
        lazy.defer(rows, pos)
        last = tok
    assert lazy.n_injected == len(PROMPT) and len(lazy._pending) == 4
    pos = tgt.n_past
    assert_rows_equal_or_close(lazy.marginals(last, pos, 15), eager.marginals(last, pos, 15))
    assert lazy.n_injected == eager.n_injected == pos and not lazy._pending
    lazy.defer(rows, pos)
    lazy.defer(rows, 3)  # a rewind: the queue (at pos) is flushed, the cache cut at 3
    assert lazy.n_injected == 3 and len(lazy._pending) == 1
    for d in (eager, lazy, tgt):
        d.close()
