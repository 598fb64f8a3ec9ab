"""Batches filled in one C call (llm.Context.decode_tokens / decode_embd over tfm_batch_tokens /
tfm_batch_embd) and the verify methods' on_submit hook, on a tiny random qwen2 target (CPU)."""
from __future__ import annotations

import numpy as np
import pytest

from tfm_local.llama.model import LlamaError
from tfm_local.decode.verify import Target

from tfm_local.testing.synth import write_tiny_target


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_tiny_target(tmp_path_factory.mktemp("batch") / "t.gguf", n_layer=2, n_embd=64, seed=3)
    t = Target(path, n_ctx=256, n_batch=32, n_threads=2, n_gpu_layers=0)
    yield t
    t.close()


def _decode(t: Target, tokens, outputs, **kw) -> np.ndarray:
    t.ctx.clear()
    n = t.ctx.decode_tokens(tokens, 0, outputs, **kw)
    assert n == len(tokens)
    rows = len(tokens) if outputs == "all" else 1 if outputs == "last" else int(np.sum(outputs))
    return t.ctx.logits(rows).copy()


def test_output_flags_select_rows(target):
    toks = [5, 17, 3, 40, 9]
    every = _decode(target, toks, "all")
    np.testing.assert_allclose(_decode(target, toks, "last"), every[-1:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_decode(target, toks, [True, False, True, False, False]), every[[0, 2]],
                               rtol=1e-5, atol=1e-5)
    # explicit positions equal to the default ones give the same rows; other positions change them
    np.testing.assert_allclose(_decode(target, np.array(toks), "all", positions=np.arange(5)), every,
                               rtol=1e-5, atol=1e-5)
    moved = _decode(target, toks, "all", positions=np.arange(5) + 7)
    assert not np.allclose(moved, every, atol=1e-4)


def test_bad_batches_are_clear_errors(target):
    ctx = target.ctx
    with pytest.raises(ValueError, match="outputs must be"):
        ctx.decode_tokens([1, 2], 0, "none")
    for kw in ({"positions": [0]}, {"seq_ids": [0, 0, 0]}):
        with pytest.raises(ValueError, match="entries"):
            ctx.decode_tokens([1, 2], 0, "all", **kw)
    with pytest.raises(ValueError, match="entries"):
        ctx.decode_tokens([1, 2], 0, [True])
    with pytest.raises(LlamaError, match="code -2"):
        ctx.decode_tokens([1, target.model.n_vocab + 5], 0, "all")
    with pytest.raises(LlamaError, match="code -1"):
        ctx.decode_tokens(list(range(1, 40)), 0, "last")  # more than n_batch = 32
    with pytest.raises(ValueError, match="float32 matrix"):
        ctx.decode_embd(np.zeros(64, np.float32), 0)
    ctx.clear()
    _decode(target, [5, 6], "all")  # still usable


def test_on_submit_fires_once_before_results(target):
    calls = []
    toks, depth, parents = np.array([5, 6, 7]), np.array([0, 1, 1]), np.array([-1, 0, 0])
    target.reset()
    target.verify(toks, on_submit=lambda: calls.append("chain"))
    target.reset()
    target.verify(toks, parents, depth, on_submit=lambda: calls.append("tree"))
    target.reset()
    if target.attach_argmax(8):
        target.verify(toks, backend_choice=True, on_submit=lambda: calls.append("chain-argmax"))
        target.reset()
        target.verify(toks, parents, depth, backend_choice=True, on_submit=lambda: calls.append("tree-argmax"))
        target.detach_choice()
        assert calls[2:] == ["chain-argmax", "tree-argmax"]
    assert calls[:2] == ["chain", "tree"]
    target.reset()
