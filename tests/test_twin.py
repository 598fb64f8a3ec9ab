"""Random-weight twins of real targets (tfm_local.bench.twin): Q4_K_M tensor types, a GGUF llama.cpp
runs with finite logits, a drafter of the twin's width, and the default target's own file layout."""
from __future__ import annotations

import numpy as np
import pytest

import gguf
from tfm_local.bench.twin import (QT, SHAPES, Shape, file_rank, parse_shape, q4_k_m_type, random_blocks,
                                  twin_tensors, use_more_bits, write_twin_target)

TINY = Shape(n_layer=9, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_vocab=1024, tied=False, n_ctx_train=512)


def test_more_bits_follow_the_file_order_of_layers():
    """llama-quantize counts attn_v / ffn_down in file order, where layer numbers sort as text."""
    assert sorted(range(12), key=str)[:4] == [0, 1, 10, 11]
    assert file_rank(10, 12) == 2 and file_rank(2, 12) == 4
    more = [i for i in range(28) if use_more_bits(file_rank(i, 28), 28)]
    assert q4_k_m_type("blk.10.attn_v.weight", 28, 1536) == QT.Q6_K and 10 in more and 11 not in more
    assert q4_k_m_type("blk.11.ffn_down.weight", 28, 8960) == QT.Q4_K
    assert q4_k_m_type("output.weight", 28, 1536) == QT.Q6_K and q4_k_m_type("output.weight", 28, 96) == QT.Q8_0
    assert q4_k_m_type("output.weight", 28, 100) == QT.F16  # not even whole 32-blocks
    assert q4_k_m_type("blk.3.attn_q.weight", 28, 1536) == QT.Q4_K


def test_random_blocks_have_small_finite_values():
    rng = np.random.default_rng(0)
    for qt in (QT.Q4_K, QT.Q6_K, QT.Q8_0):
        data = random_blocks(rng, 4, 512, qt)
        values = gguf.quants.dequantize(data, qt)
        assert values.shape == (4, 512) and np.isfinite(values).all() and 0 < np.abs(values).max() < 1
    with pytest.raises(ValueError, match="multiple"):
        random_blocks(rng, 2, 100, QT.Q4_K)


def test_a_twin_runs_in_llama_cpp_with_finite_logits(tmp_path):
    from tfm_local.decode.verify import Target

    path = write_twin_target(tmp_path / "twin.gguf", TINY, seed=1)
    r = gguf.GGUFReader(path)
    got = {t.name: t.tensor_type for t in r.tensors}
    want = {n: q for n, _, q in twin_tensors(TINY)}
    assert got == want and want["output.weight"] == QT.Q6_K and want["token_embd.weight"] == QT.Q4_K
    assert {want[f"blk.{i}.attn_v.weight"] for i in range(9)} == {QT.Q4_K, QT.Q6_K}
    t = Target(path, n_ctx=128, n_batch=32, n_threads=1)
    try:
        assert t.model.n_vocab == 1024 and t.model.n_layer == 9
        logits = np.array(t.prefill([5, 6, 7, 8]))
        assert logits.shape == (1024,) and np.isfinite(logits).all()
        v = t.verify([9, 10, 11], [-1, 0, 0])
        assert np.isfinite(np.array(v.logits[2])).all()
        t.commit([0, 2])
    finally:
        t.close()


def test_a_twin_gets_a_random_drafter_that_drafts(tmp_path):
    from tfm_convert.pipeline import init_random
    from tfm_local.decode.draft import DFlashDrafter
    from tfm_local.decode.verify import Target

    path = write_twin_target(tmp_path / "twin.gguf", TINY, seed=2)
    drafter, _ = init_random(path, tmp_path / "drafter.gguf", layers=1, seed=3, outtype="q8_0")
    t = Target(path, n_ctx=128, n_batch=32, n_threads=1)
    d = DFlashDrafter(drafter, t, n_threads=1)
    try:
        t.set_features(d.layers)
        t.prefill([5, 6, 7, 8], lambda s, n: d.inject(t.features(slice(0, n), n), s))
        cand, logp = d.top_k(9, 4, 3, 4)
        assert np.asarray(cand).shape == (3, 4) and np.isfinite(np.asarray(logp)).all()
    finally:
        d.close()
        t.close()


def test_widths_off_the_256_block_take_llama_quantizes_fallbacks(tmp_path):
    """Qwen2.5-0.5B is 896 wide: its 896-column matrices fall back to Q5_0 (from Q4_K) and its tied
    embedding to Q8_0 (from Q6_K), as llama-quantize does; the 4864-column ffn_down keeps the K types."""
    types = {n: q for n, _, q in twin_tensors(SHAPES["qwen2.5-0.5b"])}
    assert types["token_embd.weight"] == QT.Q8_0 and types["blk.3.attn_q.weight"] == QT.Q5_0
    assert {types[f"blk.{i}.ffn_down.weight"] for i in range(24)} == {QT.Q4_K, QT.Q6_K}
    small = Shape(n_layer=2, n_embd=96, n_ff=256, n_head=2, n_head_kv=1, n_vocab=512, tied=True, n_ctx_train=256)
    r = gguf.GGUFReader(write_twin_target(tmp_path / "t.gguf", small))
    assert {t.name: t.tensor_type for t in r.tensors}["token_embd.weight"] == QT.Q8_0


def test_shapes_parse_and_bad_ones_are_refused():
    assert parse_shape("qwen2.5-7b") == SHAPES["qwen2.5-7b"]
    assert parse_shape("2,256,512,4,2,1024") == Shape(2, 256, 512, 4, 2, 1024, False)
    assert parse_shape("2,256,512,4,2,1024,tied").tied
    for bad in ("qwen9", "2,256,512", "2,256,512,4,2,x", "0,256,512,4,2,1024", "2,256,512,4,2,1024,untied"):
        with pytest.raises(ValueError, match="--shape"):
            parse_shape(bad)
    with pytest.raises(ValueError, match="divisible"):
        write_twin_target("/nonexistent/x.gguf", Shape(2, 250, 512, 4, 2, 1024, False))


@pytest.mark.integration
def test_the_default_targets_twin_has_its_tensor_types_and_shapes():
    """The twin of the default target's shape lists exactly the tensors of the real Q4_K_M file, with
    their types and shapes (llama-quantize's choices, file-order rule included)."""
    from tfm_local.files.models import DEFAULT_TARGET, resolve_model

    r = gguf.GGUFReader(resolve_model(DEFAULT_TARGET))
    real = {t.name: (t.tensor_type, tuple(int(x) for x in t.shape[::-1])) for t in r.tensors}
    twin = {n: (q, tuple(shp)) for n, shp, q in twin_tensors(SHAPES["qwen2.5-coder-1.5b"])}
    assert twin == real


def test_the_command_refuses_bad_input_before_writing_anything(tmp_path, capsys):
    from tfm_local.bench.twin import main

    cases = [(["--shape", "2,256,512,4,2,1024", "--drafter-type", "q9"], "--drafter-type"),
             (["--shape", "2,256,512,4,2,10"], "n_vocab"),
             (["--shape", "2,256,512,4,2,1024", "--drafter-layers", "-1"], "--drafter-layers"),
             (["--shape", "2,256,512,4,2,1024", "--seed", "-3"], "--seed"),
             (["--shape", "2,258,512,4,2,1024"], "divisible"),
             (["--shape", "2,96,256,32,2,1024"], "even")]
    for i, (args, msg) in enumerate(cases):
        out = tmp_path / f"o{i}"
        with pytest.raises(SystemExit) as e:
            main([*args, "--out", str(out)])
        assert msg in str(e.value.code) and str(e.value.code).startswith("tfm-bench-twin: ")
        assert not (out / "target.gguf").exists() and not list(out.glob(".*.tmp")) if out.exists() else True
    with pytest.raises(SystemExit, match="at least 2 layers"):
        main(["--shape", "1,256,512,4,2,1024", "--out", str(tmp_path / "one")])
    with pytest.raises(SystemExit, match="empty"):
        main(["--shape", "2,256,512,4,2,1024", "--out", ""])
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit, match="not a folder"):
        main(["--shape", "2,256,512,4,2,1024", "--out", str(tmp_path / "file")])
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "drafter.gguf").write_text("an earlier twin's")
    main(["--shape", "2,256,512,4,2,1024", "--out", str(tmp_path / "ok"), "--drafter-layers", "0"])
    assert [p.name for p in (tmp_path / "ok").iterdir()] == ["target.gguf"]


def test_narrow_rows_fall_back_to_f16_and_oversized_twins_are_refused(tmp_path):
    from tfm_local.bench.twin import MAX_BYTES, check_shape, twin_bytes
    from tfm_local.decode.verify import Target

    narrow = Shape(n_layer=2, n_embd=80, n_ff=100, n_head=4, n_head_kv=2, n_vocab=512, tied=True, n_ctx_train=256)
    types = {n: q for n, _, q in twin_tensors(narrow)}
    assert types["token_embd.weight"] == QT.F16 and types["blk.0.ffn_down.weight"] == QT.F16
    t = Target(write_twin_target(tmp_path / "n.gguf", narrow), n_ctx=64, n_batch=16, n_threads=1)
    try:
        assert np.isfinite(np.array(t.prefill([5, 6, 7]))).all()
    finally:
        t.close()
    assert twin_bytes(SHAPES["qwen2.5-coder-1.5b"]) < (2 << 30) < twin_bytes(SHAPES["qwen2.5-7b"]) < MAX_BYTES
    with pytest.raises(ValueError, match="GiB"):
        check_shape(Shape(16, 65536, 65536, 256, 8, 400, False))
    with pytest.raises(ValueError, match="at most"):
        check_shape(Shape(2, 64, 128, 4, 2, 100_000_000_000, False))
