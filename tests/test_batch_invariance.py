"""Batch invariance on the CPU (patch 0015): every row of a verify pass of 1-16 tokens, chain or tree,
has the bits of the logits that the same path decoded one token at a time gives, on a tiny random
target (F32) and on the real default target (Q4_K / Q6_K, repacked weights and not)."""
from __future__ import annotations

import os
from contextlib import closing

import numpy as np
import pytest

from tfm_local.decode.verify import Target
from tfm_local.testing.synth import write_tiny_target


def _one_at_a_time(t: Target, n_past: int, path: list[int]) -> np.ndarray:
    """Logits after each token of ``path`` decoded alone from position ``n_past`` (cache cut back first)."""
    t.ctx.truncate(n_past)
    rows = []
    for i, tok in enumerate(path):
        t.ctx.decode_tokens([tok], n_past + i, "all")
        rows.append(t.ctx.logits(1)[0].copy())
    t.ctx.truncate(n_past)
    return np.array(rows)


def _random_tree(rng, n: int) -> np.ndarray:
    """Parents of a random n-node tree in topological order (node 0 the root)."""
    return np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])


def _paths(parents: np.ndarray) -> list[list[int]]:
    out = []
    for i in range(len(parents)):
        p, node = [], i
        while node >= 0:
            p.append(node)
            node = parents[node]
        out.append(p[::-1])
    return out


def _check(t: Target, rng, sizes, trees: bool) -> list[str]:
    """Verify random chains (and trees) of the given sizes after a random prompt; the rows that differ
    from one-at-a-time decoding, as messages."""
    vocab = min(t.model.n_vocab, 30000)
    t.reset()
    t.prefill(rng.integers(0, vocab, size=37).tolist())
    n_past = t.n_past
    bad = []
    for n in sizes:
        tokens = rng.integers(0, vocab, size=n)
        shapes = [None] + ([_random_tree(rng, n)] if trees and n > 2 else [])
        for parents in shapes:
            rows = np.array(t.verify(tokens, parents).logits, dtype=np.float32)
            t.commit([])
            par = np.arange(-1, n - 1) if parents is None else parents
            for node, path in enumerate(_paths(par)):
                want = _one_at_a_time(t, n_past, tokens[path].tolist())[-1]
                if not np.array_equal(rows[node], want):
                    kind = "chain" if parents is None else f"tree {par.tolist()}"
                    bad.append(f"{kind} of {n}: node {node} differs by up to {np.abs(rows[node] - want).max():.3g}")
    return bad


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random qwen2 target, 96 wide with a 160-wide FFN: neither a multiple of the F32 kernels' step
    (64 values with AVX-512), so their tails run too."""
    gguf = write_tiny_target(tmp_path_factory.mktemp("inv") / "t.gguf", n_layer=3, n_embd=96, n_ff=160, seed=5)
    with closing(Target(gguf, n_ctx=512, n_batch=32, n_threads=2, n_gpu_layers=0)) as t:
        yield t


def test_tiny_target_chains_and_trees_are_batch_invariant(tiny):
    rng = np.random.default_rng(11)
    assert _check(tiny, rng, [2, 3, 4, 5, 7, 8, 11, 16], trees=True) == []


@pytest.mark.integration
@pytest.mark.parametrize("repack", ["1", "0"], ids=["repacked", "plain"])
def test_real_target_chains_and_trees_are_batch_invariant(repack, monkeypatch):
    from tfm_local.files.models import DEFAULT_TARGET, resolve_model

    monkeypatch.setenv("TFM_NO_REPACK", "0" if repack == "1" else "1")
    t = Target(resolve_model(DEFAULT_TARGET), n_ctx=1024, n_batch=64, n_threads=os.cpu_count() or 2,
               n_gpu_layers=0)
    try:
        rng = np.random.default_rng(3)
        assert _check(t, rng, [2, 4, 8, 16], trees=True) == []
    finally:
        t.close()
