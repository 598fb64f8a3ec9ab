"""The shape-configurable qwen35 writer (tfm_local.testing.hybrid) and the verify-step benchmark
(tfm_local.bench.verify_step, tfm-bench verify), CPU, tiny dims."""
from __future__ import annotations

import json

import numpy as np
import pytest

import gguf
from tfm_local.testing import hybrid as sh
from tfm_local.bench import verify_step as vs
from tfm_local.bench import verify_step_cli as bench_verify_step
from tfm_local.llama.model import Context, Model, gpu_available
from tfm_local.bench.provenance import problems

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: not the test model's defaults: 8 layers (2 groups of 3 DeltaNet + 1 attention, the 27B pattern),
#: H_v = 3 H_k, S 32, attention heads 6 / 2 of 32, 48 rotated dims... kept small for 2 shared cores
ODD = sh.HybridShape(n_layer=8, n_embd=96, n_head=6, n_head_kv=2, head_dim=32, n_rot=16, n_ff=160,
                     full_attn_interval=4, d_state=32, n_k_heads=2, n_v_heads=6, d_conv=3, n_vocab=448)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_writer_shapes_load_and_run(tmp_path, dtype):
    path = sh.write_qwen35(tmp_path / "h.gguf", ODD, dtype=dtype, seed=2)
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    # GGUF ne order (numpy reversed); layers 3 and 7 attention, the rest DeltaNet
    assert sorted(i for i in range(8) if f"blk.{i}.attn_q.weight" in t) == [3, 7]
    assert list(t["blk.0.attn_qkv.weight"].shape) == [96, 32 * (2 * 2 + 6)]
    assert list(t["blk.0.ssm_out.weight"].shape) == [32 * 6, 96]
    assert list(t["blk.3.attn_q.weight"].shape) == [96, 2 * 6 * 32]
    assert list(t["blk.3.attn_k.weight"].shape) == [96, 2 * 32]
    assert list(t["blk.1.ffn_down.weight"].shape) == [160, 96]
    assert list(t["token_embd.weight"].shape) == [96, 448]
    want = gguf.GGMLQuantizationType.F16 if dtype == "f16" else gguf.GGMLQuantizationType.F32
    assert t["blk.0.ffn_up.weight"].tensor_type == want
    assert t["blk.0.ssm_conv1d.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert t["blk.0.ssm_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert r.fields["qwen35.full_attention_interval"].contents() == 4
    assert r.fields["qwen35.ssm.group_count"].contents() == 2
    assert abs(path.stat().st_size - sh.file_bytes(ODD, dtype)) < 200_000  # + tokenizer and header
    m = Model(path, n_gpu_layers=0)
    assert (m.arch, m.n_layer, m.n_embd, m.n_vocab) == ("qwen35", 8, 96, 448)
    ctx = Context(m, n_ctx=64, n_batch=32, n_ubatch=32, n_threads=2)
    ctx.decode_tokens(list(range(20)), 0, "all")
    logits = ctx.logits(20).copy()
    assert np.isfinite(logits).all()
    assert 0.5 < logits.std() < 20  # neither flat nor exploding after 8 layers
    ctx.close()
    m.close()


def test_writer_is_deterministic_and_streams(tmp_path, monkeypatch):
    monkeypatch.setattr(sh, "CHUNK_ELEMENTS", 1000)  # every 2-D tensor in several chunks
    a = sh.write_qwen35(tmp_path / "a.gguf", ODD, dtype="f16", seed=5).read_bytes()
    monkeypatch.setattr(sh, "CHUNK_ELEMENTS", 1 << 24)
    b = sh.write_qwen35(tmp_path / "b.gguf", ODD, dtype="f16", seed=5).read_bytes()
    c = sh.write_qwen35(tmp_path / "c.gguf", ODD, dtype="f16", seed=6).read_bytes()
    assert a == b and a != c


@pytest.mark.parametrize("kw", [{"n_v_heads": 5}, {"n_rot": 12}, {"full_attn_interval": 9}, {"n_ff": 0}])
def test_writer_rejects_bad_shapes(tmp_path, kw):
    with pytest.raises(ValueError):
        sh.write_qwen35(tmp_path / "x.gguf", ODD.replace(**kw))


def test_qwen36_27b_shape():
    s = sh.HybridShape.qwen36_27b(n_layer=8)
    s.validate()
    assert [s.is_attention(i) for i in range(8)] == [False, False, False, True] * 2
    assert s.conv_dim == 10240 and s.d_state * s.n_v_heads == 6144
    # 248,320 × 5120 embedding (2.54 GB) + 8 layers of about 0.76 GB, F16
    assert 8.5e9 < sh.file_bytes(s, "f16") < 8.8e9


def test_row_error_detects_differences():
    rng = np.random.default_rng(0)
    b = rng.standard_normal((3, 50)) * 3
    assert vs.row_error(b, b, 5e-3) == (0.0, True)
    a = b.copy()
    a[1, 7] += 0.1 * np.abs(b).max()
    err, ok = vs.row_error(a, b, 5e-3)
    assert not ok and err > 5e-3
    a = b.copy()
    a[2, 0] = np.nan
    assert vs.row_error(a, b, 5e-3)[1] is False


def test_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "r.json"
    bench_verify_step.main(["--tiny", "--dtype", "f32", "--vocab", "384", "--ctx", "40", "--nodes", "8,24",
                            "--iters", "2", "--warmup", "1", "--threads", "2", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["device"] == ("gpu" if gpu_available() else "cpu") and doc["vocab"] == 384 and doc["layers"] == 4
    assert doc["modes"] == ["tree", "branch", "chain"]
    assert problems(doc["provenance"]) == []  # the model was generated (dims, seed) and deleted: not hashed
    assert [c["nodes"] for c in doc["cases"]] == [8, 24]
    for c in doc["cases"]:
        assert c["check"]["correct"] is True
        assert set(c["check"]["ok"]) == {"tree_finite", "branch", "chain", "rollback"}
        assert set(c["times"]) == {"tree", "tree_commit", "branch", "chain", "chain_rollback"}
        assert all(v["median_ms"] > 0 for v in c["times"].values())
    assert doc["cases"][1]["leaves"] > 1
    assert "per-branch" in capsys.readouterr().out


def test_check_fails_on_a_wrong_branch(tmp_path):
    """The per-branch comparison is not vacuous: a tree whose tokens differ from the branches' fails."""
    path = sh.write_qwen35(tmp_path / "h.gguf", sh.HybridShape(n_vocab=384), seed=1)
    rng = np.random.default_rng(0)
    case = vs.make_case(12, rng, 384, 0.5)
    tm = vs.TreeMode(path, 24, 12, 2)
    tm.prefill([int(t) for t in rng.integers(0, 384, 24)])
    bm = vs.BranchMode(tm.target, [int(t) for t in rng.integers(0, 384, 24)], len(case.paths),
                       sum(map(len, case.paths)), 2)  # another prompt in the branch context
    try:
        res = vs.check_case(case, {"tree": tm, "branch": bm}, 5e-3)
        assert res["ok"]["branch"] is False and res["correct"] is False
    finally:
        bm.close()
        tm.close()
