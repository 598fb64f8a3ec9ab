"""tfm-convert: random drafters, z-lab checkpoints → GGUF, and refusal of bad input."""
from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

import gguf
from tfm_local.testing import synth
from tfm_convert import ConvertError
from tfm_convert.cli import main, resolve_target
from tfm_local.files.dflash import DrafterDims, expected_shapes, gguf_name
from tfm_convert.pipeline import convert_checkpoint, init_random
from tfm_convert.random_init import attention_geometry, spread_target_layers
from tfm_convert.safetensors_io import read_safetensors, to_bf16_bits, write_safetensors
from tfm_convert.target_info import read_target_info
from tfm_convert.writer import write_drafter_gguf
from tfm_convert.zlab import index_tensors, read_config

N_LAYER = 6  # target depth: 5 feature layers fit


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return synth.write_tiny_target(tmp_path_factory.mktemp("target") / "target.gguf", n_layer=N_LAYER, seed=3)


@pytest.fixture(scope="module")
def hf_ckpt(tmp_path_factory, target):
    folder = tmp_path_factory.mktemp("hf") / "drafter"
    init_random(target, hf_out=folder, layers=2, seed=5)
    return folder


def _load_hf(folder):
    return json.loads((folder / "config.json").read_text()), {n: t.load() for n, t in index_tensors(folder).items()}


def _copy_ckpt(src, dst, *, config=None, tensors=None):
    """A modified copy of a checkpoint folder (config dict and/or tensor dict replaced)."""
    cfg, ts = _load_hf(src)
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps(config if config is not None else cfg))
    write_safetensors(dst / "model.safetensors", tensors if tensors is not None else ts)
    return dst


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


# -- pure helpers ------------------------------------------------------------------------

@pytest.mark.parametrize("n_layer", range(2, 81))
def test_spread_target_layers_properties(n_layer):
    ids = spread_target_layers(n_layer)
    assert len(ids) == min(5, n_layer - 1)
    assert ids == sorted(set(ids))
    assert 0 <= ids[0] <= 1 and ids[-1] <= n_layer - 2
    if n_layer >= 10:
        assert ids[-1] >= 0.75 * (n_layer - 1)  # reaches deep layers


def test_spread_target_layers_refuses_one_layer():
    with pytest.raises(ConvertError):
        spread_target_layers(1)


@pytest.mark.parametrize("n_embd", [64, 96, 128, 256, 640, 896, 1536, 2048, 4096])
def test_attention_geometry(n_embd):
    heads, kv, head_dim = attention_geometry(n_embd)
    assert heads * head_dim == n_embd and heads % kv == 0 and heads >= 4 and kv <= heads


def test_gguf_names_cover_the_layout():
    names = [gguf_name(n) for n in expected_shapes(DrafterDims(64, 2, 4, 2, 16, 96, 3))]
    assert len(set(names)) == len(names)
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight"} <= set(names)
    assert "blk.1.attn_output.weight" in names and "blk.1.ffn_down.weight" in names
    assert not any(n.startswith(("token_embd", "output.")) for n in names)


def test_safetensors_against_reference_library(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(0)
    arrays = {"a.weight": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32)}
    write_safetensors(tmp_path / "ours.safetensors", arrays)
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    for k, v in arrays.items():
        np.testing.assert_array_equal(theirs[k], v)
    st.save_file({k: v.astype(np.float16) for k, v in arrays.items()}, str(tmp_path / "ref.safetensors"))
    ours = read_safetensors(tmp_path / "ref.safetensors")
    for k, v in arrays.items():
        np.testing.assert_array_equal(ours[k].load(), v.astype(np.float16).astype(np.float32))


def test_bf16_rounding_is_nearest():
    x = np.array([1.0, 1.0 + 2**-9, 1.0 + 3 * 2**-9, -2.5e-3, 3.0e5], dtype=np.float32)
    back = (to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.abs(back - x) <= np.abs(x) * 2**-8)
    assert back[1] == 1.0 and back[2] == 1.0 + 2**-7  # ties to even, then round up


# -- target facts ------------------------------------------------------------------------

def test_target_info(target):
    info = read_target_info(target)
    r = gguf.GGUFReader(target)
    assert (info.arch, info.n_embd, info.n_layer) == ("qwen2", 64, N_LAYER)
    assert info.n_vocab == len(r.fields["tokenizer.ggml.tokens"].data)
    mask = info.pick_mask_token()
    assert r.fields["tokenizer.ggml.token_type"].contents()[mask] == int(gguf.TokenType.UNUSED)
    assert {kv.key for kv in info.tokenizer} >= {"tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                                 "tokenizer.chat_template"}


# -- random init -------------------------------------------------------------------------

def test_init_random_hf_layout_is_consistent(hf_ckpt, target):
    cfg, tensors = _load_hf(hf_ckpt)
    info = read_target_info(target)
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["hidden_size"] == info.n_embd and cfg["vocab_size"] == info.n_vocab
    assert cfg["num_hidden_layers"] == 2 and cfg["dflash_config"]["block_size"] == 16
    assert cfg["dflash_config"]["target_layer_ids"] == spread_target_layers(N_LAYER)
    assert cfg["dflash_config"]["mask_token_id"] == info.pick_mask_token()
    config = read_config(hf_ckpt)
    assert {n: t.shape for n, t in tensors.items()} == expected_shapes(config.dims)


def test_init_random_cli_options_and_seed(tmp_path, target):
    args = ["--init-random", "--target", str(target), "--layers", "3", "--ffn", "96"]
    assert main(args + ["--seed", "1", "--hf-out", str(tmp_path / "a")]) == 0
    assert main(args + ["--seed", "1", "--hf-out", str(tmp_path / "b")]) == 0
    assert main(args + ["--seed", "2", "--hf-out", str(tmp_path / "c")]) == 0
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3 and cfg["intermediate_size"] == 96
    blob = {k: (tmp_path / k / "model.safetensors").read_bytes() for k in "abc"}
    assert blob["a"] == blob["b"] and blob["a"] != blob["c"]


# -- z-lab → GGUF ------------------------------------------------------------------------

def _expected_type(shape, outtype):
    if len(shape) == 1:
        return gguf.GGMLQuantizationType.F32
    qt = gguf.GGMLQuantizationType[outtype.upper()]
    if outtype[0] in "qi" and shape[-1] % gguf.GGML_QUANT_SIZES[qt][0]:
        return gguf.GGMLQuantizationType.F16
    return qt


@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0", "q5_0", "q4_0", "q4_k", "iq4_nl"])
def test_convert_outtypes_metadata_and_types(tmp_path, hf_ckpt, target, outtype):
    out = convert_checkpoint(hf_ckpt, target, tmp_path / "d.gguf", outtype)
    assert _files(tmp_path) == ["d.gguf"]
    cfg, tensors = _load_hf(hf_ckpt)
    r = gguf.GGUFReader(out)
    f = r.fields
    assert f["general.architecture"].contents() == "dflash"
    assert f["dflash.target_layers"].contents() == [i + 1 for i in cfg["dflash_config"]["target_layer_ids"]]
    assert f["dflash.block_size"].contents() == 16
    assert f["tokenizer.ggml.mask_token_id"].contents() == cfg["dflash_config"]["mask_token_id"]
    assert f["dflash.embedding_length"].contents() == cfg["hidden_size"]
    assert f["dflash.attention.head_count_kv"].contents() == cfg["num_key_value_heads"]
    t = gguf.GGUFReader(target).fields
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.chat_template"):
        assert f[key].contents() == t[key].contents()
    by_name = {x.name: x for x in r.tensors}
    assert set(by_name) == {gguf_name(n) for n in tensors}
    for n, a in tensors.items():
        x = by_name[gguf_name(n)]
        assert tuple(int(s) for s in reversed(x.shape)) == a.shape
        assert x.tensor_type == _expected_type(a.shape, outtype)


def test_q8_0_falls_back_for_odd_rows(tmp_path, target):
    init_random(target, hf_out=tmp_path / "hf", ffn=72)  # ffn_down rows of 72: not a multiple of 32
    out = convert_checkpoint(tmp_path / "hf", target, tmp_path / "d.gguf", "q8_0")
    types_ = {t.name: t.tensor_type for t in gguf.GGUFReader(out).tensors}
    assert types_["blk.0.ffn_down.weight"] == gguf.GGMLQuantizationType.F16
    assert types_["blk.0.ffn_up.weight"] == gguf.GGMLQuantizationType.Q8_0


def test_f32_values_equal_the_safetensors(tmp_path, hf_ckpt, target):
    st = pytest.importorskip("safetensors.numpy")
    ref = st.load_file(str(hf_ckpt / "model.safetensors"))
    out = convert_checkpoint(hf_ckpt, target, tmp_path / "d.gguf", "f32")
    by_name = {x.name: x for x in gguf.GGUFReader(out).tensors}
    for n in ("fc.weight", "layers.0.self_attn.k_proj.weight", "layers.1.mlp.down_proj.weight", "norm.weight"):
        x = by_name[gguf_name(n)]
        assert list(reversed(x.shape.tolist())) == list(ref[n].shape)  # GGUF ne is numpy shape reversed
        np.testing.assert_array_equal(np.asarray(x.data).reshape(ref[n].shape), ref[n])


def test_read_drafter_gguf_inverts_the_writer(tmp_path, hf_ckpt, target):
    """f32 round trip: the same config and bit-equal weights; GGUF names map back to HF names."""
    from tfm_convert.read_drafter import hf_name, read_drafter_gguf

    for n in expected_shapes(DrafterDims(64, 2, 4, 2, 16, 96, 3)):
        assert hf_name(gguf_name(n)) == n
    with pytest.raises(KeyError):
        hf_name("token_embd.weight")
    ref, config = _load_hf(hf_ckpt)[1], read_config(hf_ckpt)
    info = read_target_info(target)
    got_config, got = read_drafter_gguf(convert_checkpoint(hf_ckpt, target, tmp_path / "d.gguf", "f32"),
                                        num_target_layers=info.n_layer)
    assert got_config.dims == config.dims and got_config.target_layer_ids == config.target_layer_ids
    assert (got_config.mask_token_id, got_config.block_size, got_config.vocab_size) == \
        (config.mask_token_id, config.block_size, config.vocab_size)
    assert sorted(got) == sorted(n for n in ref if n in expected_shapes(config.dims))
    for n, a in got.items():
        np.testing.assert_array_equal(a, ref[n])


def test_read_drafter_gguf_refuses_bad_tensors_clearly(tmp_path, hf_ckpt, target):
    """A type gguf cannot dequantize, a layer past block_count: ConvertError (no traceback from the
    file machinery); a copy of the target's embedding is skipped, not an error."""
    from dataclasses import replace

    from tfm_local.files.gguf_meta import read_gguf_meta
    from tfm_convert.read_drafter import read_drafter_gguf
    from tfm_convert.vocab import rewrite_gguf

    src = convert_checkpoint(hf_ckpt, target, tmp_path / "d.gguf", "f32")
    meta = read_gguf_meta(src)
    kvs = list(meta.kv.values())
    by_name = {t.name: t for t in meta.tensors}

    def variant(name, tensors):
        return rewrite_gguf(src, replace(meta, tensors=tensors), kvs, tmp_path / name)

    fc = by_name["fc.weight"]
    q8k = replace(fc, ggml_type=int(gguf.GGMLQuantizationType.Q8_K),
                  nbytes=int(np.prod(fc.ne)) // 256 * gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_K][1])
    bad_type = variant("q8k.gguf", [q8k if t.name == "fc.weight" else t for t in meta.tensors])
    with pytest.raises(ConvertError, match="cannot dequantize"):
        read_drafter_gguf(bad_type)
    extra = replace(by_name["blk.0.attn_q.weight"], name="blk.7.attn_q.weight")
    with pytest.raises(ConvertError, match="unexpected tensor 'blk.7.attn_q.weight'"):
        read_drafter_gguf(variant("extra.gguf", meta.tensors + [extra]))
    copy = replace(by_name["output_norm.weight"], name="token_embd.weight")
    _, weights = read_drafter_gguf(variant("shared.gguf", meta.tensors + [copy]))
    assert sorted(weights) == sorted(read_drafter_gguf(src)[1])


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_half_precision_checkpoints_convert_exactly(tmp_path, target, dtype):
    init_random(target, hf_out=tmp_path / "f32", seed=9)
    init_random(target, hf_out=tmp_path / "half", seed=9, hf_dtype=dtype)
    _, exact = _load_hf(tmp_path / "f32")
    out = convert_checkpoint(tmp_path / "half", target, tmp_path / "d.gguf", "f32")
    by_name = {x.name: np.asarray(x.data) for x in gguf.GGUFReader(out).tensors}
    for n, a in exact.items():
        want = ((to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32) if dtype == "BF16"
                else a.astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(by_name[gguf_name(n)].reshape(a.shape), want)


@pytest.mark.parametrize("outtype,bound", [("q8_0", 0.51 / 127), ("q5_0", 1.01 / 16), ("q4_0", 1.01 / 8)])
def test_block_types_values_within_quantisation_error(tmp_path, hf_ckpt, target, outtype, bound):
    """Every value within its type's error bound × block max: half a step for Q8_0 (symmetric,
    127 levels a side); one step for Q5_0/Q4_0 (scale max/−16, max/−8: the far side clips)."""
    _, tensors = _load_hf(hf_ckpt)
    out = convert_checkpoint(hf_ckpt, target, tmp_path / "d.gguf", outtype)
    n_quant = 0
    for x in gguf.GGUFReader(out).tensors:
        if x.tensor_type != gguf.GGMLQuantizationType[outtype.upper()]:
            continue
        n_quant += 1
        hf = next(n for n in tensors if gguf_name(n) == x.name)
        a = tensors[hf]
        deq = gguf.quants.dequantize(np.asarray(x.data), x.tensor_type).reshape(a.shape)
        block_max = np.abs(a.reshape(-1, 32)).max(axis=1, keepdims=True)
        err = np.abs(deq - a).reshape(-1, 32)
        assert (err <= block_max * bound + 1e-3 * block_max).all()
    assert n_quant > 0


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A target and a drafter 256 wide: every matrix row is a whole Q4_K super-block."""
    d = tmp_path_factory.mktemp("wide")
    tgt = synth.write_tiny_target(d / "t.gguf", n_layer=N_LAYER, n_embd=256, n_ff=256, seed=4)
    init_random(tgt, hf_out=d / "hf", layers=1, seed=6)
    return tgt, d / "hf"


@pytest.mark.parametrize("outtype", ["q4_k", "iq4_nl"])
def test_ggml_quantised_types_load_and_beat_q4_0(tmp_path, lc, wide, outtype):
    """Q4_K / IQ4_NL (ggml's quantiser, same 4.5 bits per value as Q4_0): every matrix has the type, the
    bytes decode (gguf) closer to the float weights than Q4_0's, and llama.cpp drafts with the file
    about as the f32 one does."""
    target, hf = wide
    _, tensors = _load_hf(hf)
    out = convert_checkpoint(hf, target, tmp_path / "d.gguf", outtype)
    q4 = {x.name: x for x in gguf.GGUFReader(convert_checkpoint(hf, target, tmp_path / "q4.gguf", "q4_0")).tensors}
    qt = gguf.GGMLQuantizationType[outtype.upper()]
    err, err_q4 = 0.0, 0.0
    for x in gguf.GGUFReader(out).tensors:
        a = tensors[next(n for n in tensors if gguf_name(n) == x.name)]
        if a.ndim == 1:
            continue
        assert x.tensor_type == qt and x.n_bytes == q4[x.name].n_bytes
        err += float(((gguf.quants.dequantize(np.asarray(x.data), qt).reshape(a.shape) - a) ** 2).sum())
        y = q4[x.name]
        err_q4 += float(((gguf.quants.dequantize(np.asarray(y.data), y.tensor_type).reshape(a.shape) - a) ** 2).sum())
    assert 0 < err < 0.95 * err_q4
    ref = convert_checkpoint(hf, target, tmp_path / "f32.gguf", "f32")
    layers, mask, _ = _drafter_facts(lc, out)
    feats = np.random.default_rng(1).standard_normal((4, len(layers) * 256)).astype(np.float32)
    want = _draft(lc, target, ref, feats, [65] + [mask] * 15, 4)
    got = _draft(lc, target, out, feats, [65] + [mask] * 15, 4)
    assert np.isfinite(got).all() and np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.95


def test_requantize_a_drafter_gguf(tmp_path, wide, target):
    """tfm-convert DRAFTER.gguf --outtype q4_k: the F16 file's weights written as Q4_K (the same bytes as
    from the checkpoint's, F16 rounding aside: checked against a conversion of the F16 values); a drafter
    of another target is refused and nothing is written."""
    tgt, hf = wide
    f16 = convert_checkpoint(hf, tgt, tmp_path / "f16.gguf", "f16")
    assert main([str(f16), "--target", str(tgt), "-o", str(tmp_path / "q.gguf"), "--outtype", "q4_k"]) == 0
    cfg, ts = _load_hf(hf)
    ts16 = {n: a.astype(np.float16).astype(np.float32) for n, a in ts.items()}
    ref = convert_checkpoint(_copy_ckpt(hf, tmp_path / "ck16", tensors=ts16), tgt, tmp_path / "r.gguf", "q4_k")
    got = {x.name: np.asarray(x.data) for x in gguf.GGUFReader(tmp_path / "q.gguf").tensors}
    want = {x.name: np.asarray(x.data) for x in gguf.GGUFReader(ref).tensors}
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in got)
    with pytest.raises(SystemExit) as ex:
        main([str(f16), "--target", str(target), "-o", str(tmp_path / "bad.gguf"), "--outtype", "q4_k"])
    assert ex.value.code == 2 and not (tmp_path / "bad.gguf").exists()


def test_tfm_train_offers_every_outtype():
    """tfm-train's --outtype choices (kept without importing gguf) are tfm-convert's."""
    from tfm_convert.quant import OUTTYPES
    from tfm_local.cli.train import _OUTTYPES

    assert sorted(_OUTTYPES) == sorted(OUTTYPES)


def test_ggml_quantise_refuses_rows_off_the_block():
    from tfm_convert.ggml_quant import quantize

    with pytest.raises(ValueError, match="multiple of 256"):
        quantize(np.zeros((2, 96), np.float32), gguf.GGMLQuantizationType.Q4_K)
    with pytest.raises(ValueError, match="not quantised by ggml"):
        quantize(np.zeros((2, 256), np.float32), gguf.GGMLQuantizationType.Q4_0)


def test_shared_embedding_copies_are_dropped(tmp_path, hf_ckpt, target):
    _, tensors = _load_hf(hf_ckpt)
    tensors["embed_tokens.weight"] = np.zeros((read_target_info(target).n_vocab, 64), np.float32)
    src = _copy_ckpt(hf_ckpt, tmp_path / "ck", tensors=tensors)
    out = convert_checkpoint(src, target, tmp_path / "d.gguf", "f16")
    assert not any(t.name.startswith("token_embd") for t in gguf.GGUFReader(out).tensors)


def test_model_prefix_is_accepted(tmp_path, hf_ckpt, target):
    _, tensors = _load_hf(hf_ckpt)
    src = _copy_ckpt(hf_ckpt, tmp_path / "ck", tensors={"model." + k: v for k, v in tensors.items()})
    convert_checkpoint(src, target, tmp_path / "d.gguf", "f32")
    assert (tmp_path / "d.gguf").is_file()


# -- bad input ---------------------------------------------------------------------------

def _assert_refused(tmp_path, capsys, ckpt, target, *needles):
    """convert raises ConvertError naming every needle; the CLI exits 2 with one error line; no file left."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConvertError) as e:
        convert_checkpoint(ckpt, target, out_dir / "d.gguf", "f16")
    for n in needles:
        assert n in str(e.value)
    with pytest.raises(SystemExit) as ex:
        main([str(ckpt), "--target", str(target), "-o", str(out_dir / "d.gguf")])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tfm-convert: error: ") and "Traceback" not in err
    for n in needles:
        assert n in err
    assert _files(out_dir) == []
    return str(e.value)


def test_refuses_missing_extra_and_misshapen_tensors_in_one_message(tmp_path, capsys, hf_ckpt, target):
    _, tensors = _load_hf(hf_ckpt)
    del tensors["layers.1.mlp.up_proj.weight"], tensors["hidden_norm.weight"]
    tensors["layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    tensors["fc.weight"] = np.zeros((64, 4 * 64), np.float32)
    ckpt = _copy_ckpt(hf_ckpt, tmp_path / "ck", tensors=tensors)
    _assert_refused(tmp_path, capsys, ckpt, target, "layers.1.mlp.up_proj.weight", "hidden_norm.weight",
                    "layers.0.self_attn.q_proj.bias", "fc.weight")


@pytest.mark.parametrize("change", ["missing", "extra", "misshapen"])
def test_refuses_each_tensor_problem(tmp_path, capsys, hf_ckpt, target, change):
    _, tensors = _load_hf(hf_ckpt)
    if change == "missing":
        name = "layers.0.self_attn.k_norm.weight"
        del tensors[name]
    elif change == "extra":
        name = "layers.2.mlp.up_proj.weight"
        tensors[name] = tensors["layers.1.mlp.up_proj.weight"]
    else:
        name = "layers.1.self_attn.o_proj.weight"
        tensors[name] = tensors[name][:, :-16]
    ckpt = _copy_ckpt(hf_ckpt, tmp_path / "ck", tensors=tensors)
    msg = _assert_refused(tmp_path, capsys, ckpt, target, name)
    assert {"missing": "missing", "extra": "unexpected", "misshapen": "misshapen"}[change] in msg


def test_refuses_drafter_for_another_target(tmp_path, capsys, hf_ckpt):
    wide = synth.write_tiny_target(tmp_path / "wide.gguf", n_embd=96, n_head=4, n_head_kv=2, n_layer=N_LAYER)
    _assert_refused(tmp_path, capsys, hf_ckpt, wide, "hidden size 64", "96")
    other_vocab = synth.write_tiny_target(tmp_path / "v.gguf", n_vocab=384, n_layer=N_LAYER)
    (tmp_path / "out").rmdir()
    _assert_refused(tmp_path, capsys, hf_ckpt, other_vocab, "vocab_size", "384")


@pytest.mark.parametrize("field,value,needle", [
    ("target_layer_ids", [0, 1, 2, 3, N_LAYER - 1], f"[{N_LAYER - 1}]"),  # its feature is not extractable
    ("target_layer_ids", [-1, 1, 2, 3, 4], "[-1]"),
    ("mask_token_id", 10_000, "mask_token_id 10000"),
])
def test_refuses_out_of_range_ids(tmp_path, capsys, hf_ckpt, target, field, value, needle):
    cfg, _ = _load_hf(hf_ckpt)
    cfg["dflash_config"][field] = value
    ckpt = _copy_ckpt(hf_ckpt, tmp_path / "ck", config=cfg)
    _assert_refused(tmp_path, capsys, ckpt, target, needle)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "missing"])
def test_refuses_bad_target(tmp_path, capsys, hf_ckpt, target, damage):
    bad = tmp_path / "bad.gguf"
    data = target.read_bytes()
    if damage == "truncated":
        bad.write_bytes(data[: len(data) * 2 // 3])
    elif damage == "garbage":
        bad.write_bytes(b"not a gguf file" * 100)
    msg = _assert_refused(tmp_path, capsys, hf_ckpt, bad, str(bad.name))
    assert {"truncated": "truncated", "garbage": "not a readable GGUF", "missing": "not found"}[damage] in msg


def test_an_output_name_of_255_bytes_converts(tmp_path, hf_ckpt, target):
    """tfm-convert writes to the longest name the file system takes (its temporary file's name was longer)."""
    out = tmp_path / ("d" * 250 + ".gguf")
    assert main([str(hf_ckpt), "--target", str(target), "-o", str(out), "--outtype", "q8_0"]) == 0
    assert out.stat().st_size > 0 and _files(tmp_path) == [out.name]


def test_refuses_a_target_of_an_unknown_architecture(tmp_path, capsys, hf_ckpt, target):
    """A target whose general.architecture is one our llama.cpp build cannot read layer inputs from (here
    "bloom", every key renamed with it, so the file is otherwise whole) converted before: its drafter
    could never run (Target.set_features refuses it). Now a checkpoint, a drafter GGUF to requantize and
    a random drafter are refused with one line naming the target."""
    from tfm_local.files.dflash import FEATURE_ARCHS

    data = target.read_bytes()
    assert b"bloom" not in data and "bloom" not in FEATURE_ARCHS
    alien = tmp_path / "alien.gguf"
    alien.write_bytes(data.replace(b"qwen2", b"bloom"))  # same length: every offset stays right
    msg = _assert_refused(tmp_path, capsys, hf_ckpt, alien, "alien.gguf", "'bloom'", "qwen2")
    assert "\n" not in msg and not list((tmp_path / "out").iterdir())
    drafter = convert_checkpoint(hf_ckpt, target, tmp_path / "d.gguf", "f16")
    for args in ([str(drafter), "--target", str(alien), "-o", str(tmp_path / "q.gguf"), "--outtype", "q8_0"],
                 ["--init-random", "--target", str(alien), "-o", str(tmp_path / "r.gguf")]):
        with pytest.raises(SystemExit) as ex:
            main(args)
        err = capsys.readouterr().err
        assert ex.value.code == 2 and err.count("\n") == 1 and "alien.gguf" in err and "'bloom'" in err, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".gguf") == ["alien.gguf", "d.gguf"]


@pytest.mark.parametrize("text,needle", [
    ("{not json", "malformed config.json"),
    (json.dumps({"architectures": ["LlamaForCausalLM"]}), "DFlashDraftModel"),
    ("[1, 2]", "JSON object"),
])
def test_refuses_malformed_config(tmp_path, capsys, hf_ckpt, target, text, needle):
    ckpt = _copy_ckpt(hf_ckpt, tmp_path / "ck")
    (ckpt / "config.json").write_text(text)
    _assert_refused(tmp_path, capsys, ckpt, target, needle)


def test_refuses_config_without_required_field(tmp_path, capsys, hf_ckpt, target):
    cfg, _ = _load_hf(hf_ckpt)
    del cfg["hidden_size"]
    _assert_refused(tmp_path, capsys, _copy_ckpt(hf_ckpt, tmp_path / "ck", config=cfg), target, "hidden_size")


def test_refuses_truncated_safetensors(tmp_path, capsys, hf_ckpt, target):
    ckpt = _copy_ckpt(hf_ckpt, tmp_path / "ck")
    blob = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(blob[:-100])
    _assert_refused(tmp_path, capsys, ckpt, target, "truncated")


@pytest.mark.parametrize("damage", ["same_range", "shifted_into_the_previous", "past_the_data"])
def test_refuses_overlapping_or_outside_safetensors_ranges(tmp_path, capsys, hf_ckpt, target, damage):
    """Two tensors whose data_offsets share bytes (the same range, or one moved 4 bytes into its
    neighbour; both consistent with their shapes) were read as if whole; a range past the data section
    was refused already. Each is one error naming the file, and no output is left."""
    import struct

    ckpt = _copy_ckpt(hf_ckpt, tmp_path / "ck")
    st = (ckpt / "model.safetensors").read_bytes()
    n = struct.unpack_from("<Q", st, 0)[0]
    header = json.loads(st[8:8 + n])
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    a, b = next((x, y) for x, y in zip(names, names[1:]) if header[x]["shape"] == header[y]["shape"])
    if damage == "same_range":
        header[b]["data_offsets"] = list(header[a]["data_offsets"])
    elif damage == "shifted_into_the_previous":
        header[b]["data_offsets"] = [o - 4 for o in header[b]["data_offsets"]]
    else:
        size = len(st) - 8 - n
        header[b]["data_offsets"] = [o + size for o in header[b]["data_offsets"]]
    text = json.dumps(header).encode()
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + st[8 + n:])
    needles = ("model.safetensors",) + ((a, b, "overlap") if damage != "past_the_data" else (b,))
    _assert_refused(tmp_path, capsys, ckpt, target, *needles)


def test_failed_write_leaves_no_file_and_keeps_old_output(tmp_path, hf_ckpt, target):
    class Exploding:
        shape = (64,)

        def load(self):
            raise RuntimeError("disk on fire")

    config = read_config(hf_ckpt)
    tensors = dict(index_tensors(hf_ckpt))
    tensors["norm.weight"] = Exploding()
    out = tmp_path / "d.gguf"
    out.write_bytes(b"previous")
    with pytest.raises(RuntimeError):
        write_drafter_gguf(out, config, tensors, read_target_info(target), "f16")
    assert _files(tmp_path) == ["d.gguf"] and out.read_bytes() == b"previous"


def test_cli_usage_errors_exit_2(tmp_path, capsys, target):
    for argv in (["--target", str(target), "-o", str(tmp_path / "d.gguf")],
                 ["--init-random", "--target", str(target)],
                 ["--init-random", "--target", str(target), "-o", str(tmp_path / "no" / "d.gguf")],
                 ["--init-random", "--target", str(tmp_path / "absent.gguf"), "-o", str(tmp_path / "d.gguf")]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert capsys.readouterr().err.startswith("tfm-convert: error: ")
    assert _files(tmp_path) == []


def test_resolve_target_uses_models_resolver(tmp_path, monkeypatch, target):
    calls = []
    fake = types.ModuleType("tfm_local.files.models")
    fake.resolve_model = lambda spec: calls.append(spec) or target
    monkeypatch.setitem(sys.modules, "tfm_local.files.models", fake)
    assert resolve_target(str(target)) == target and calls == []
    assert resolve_target("tiny-name") == target and calls == ["tiny-name"]

    def refuse(spec):
        raise KeyError(spec)
    fake.resolve_model = refuse
    with pytest.raises(ConvertError, match="no-such-model"):
        resolve_target("no-such-model")


# -- llama.cpp loads and drafts ----------------------------------------------------------

@pytest.fixture(scope="module")
def lc():
    return pytest.importorskip("llama_cpp")


def _draft(lc, target_path, drafter_path, features, block_tokens, pos0):
    """Load target + drafter, inject ``features`` at 0..n-1, decode ``block_tokens`` at pos0; logits."""
    tmodel = synth.load_model(target_path)
    dmodel = synth.load_model(drafter_path)
    tctx = synth.new_context(tmodel)
    dctx = synth.new_context(dmodel, n_batch=32, ctx_other=tctx)
    try:
        lc.llama_set_causal_attn(dctx, False)
        synth.decode_embeddings(dctx, features, 0)
        return synth.decode_tokens(dctx, block_tokens, pos0)
    finally:
        lc.llama_free(dctx)
        lc.llama_free(tctx)
        lc.llama_model_free(dmodel)
        lc.llama_model_free(tmodel)


def _drafter_facts(lc, drafter_path):
    from tfm_local.llama import native
    model = synth.load_model(drafter_path)
    try:
        vocab = lc.llama_model_get_vocab(model)
        return native.model_target_layers(model), lc.llama_vocab_mask(vocab), lc.llama_vocab_n_tokens(vocab)
    finally:
        lc.llama_model_free(model)


def test_random_drafter_loads_and_drafts_in_llama_cpp(tmp_path, lc, target):
    out, hf = init_random(target, tmp_path / "d.gguf", hf_out=tmp_path / "hf", layers=2, outtype="f32", seed=4)
    cfg = json.loads((hf / "config.json").read_text())["dflash_config"]
    info = read_target_info(target)
    layers, mask, n_vocab = _drafter_facts(lc, out)
    assert layers == [i + 1 for i in cfg["target_layer_ids"]] and len(layers) == 5
    assert mask == cfg["mask_token_id"] == info.pick_mask_token()
    assert n_vocab == info.n_vocab

    rng = np.random.default_rng(0)
    n_ctx_tokens, width = 6, len(layers) * info.n_embd
    block = [synth.TinyVocab().special["<|im_start|>"]] + [mask] * 15
    feats_a = rng.standard_normal((n_ctx_tokens, width)).astype(np.float32)
    feats_b = rng.standard_normal((n_ctx_tokens, width)).astype(np.float32)
    logits_a = _draft(lc, target, out, feats_a, block, n_ctx_tokens)
    logits_b = _draft(lc, target, out, feats_b, block, n_ctx_tokens)
    logits_a2 = _draft(lc, target, out, feats_a, block, n_ctx_tokens)
    assert logits_a.shape == (16, info.n_vocab) and np.isfinite(logits_a).all()
    assert logits_a.std(axis=1).min() > 0.1  # the shared LM head gives spread logits
    np.testing.assert_allclose(logits_a2, logits_a, rtol=0, atol=1e-4)  # deterministic
    assert np.abs(logits_a - logits_b).max() > 0.5  # the injected features matter


@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0", "q5_0", "q4_0"])
def test_converted_drafters_load_and_agree_with_f32(tmp_path, lc, hf_ckpt, target, outtype):
    ref = convert_checkpoint(hf_ckpt, target, tmp_path / "f32.gguf", "f32")
    out = convert_checkpoint(hf_ckpt, target, tmp_path / f"{outtype}.gguf", outtype)
    cfg = json.loads((hf_ckpt / "config.json").read_text())["dflash_config"]
    layers, mask, _ = _drafter_facts(lc, out)
    assert layers == [i + 1 for i in cfg["target_layer_ids"]] and mask == cfg["mask_token_id"]
    feats = np.random.default_rng(1).standard_normal((4, len(layers) * 64)).astype(np.float32)
    block = [65] + [mask] * 15
    want = _draft(lc, target, ref, feats, block, 4)
    got = _draft(lc, target, out, feats, block, 4)
    assert np.isfinite(got).all()
    # quantisation noise only: far below the effect of other features (checked in the test above)
    rel, corr = {"f16": (0.05, 0.9999), "bf16": (0.1, 0.9999), "q8_0": (0.3, 0.998), "q5_0": (0.6, 0.99),
                 "q4_0": (1.5, 0.95)}[outtype]
    assert np.abs(got - want).max() < rel * want.std()
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > corr


def test_random_drafter_drafts_from_real_target_features(tmp_path, lc):
    """Every target layer the random init picks is one llama.cpp extracts (here a llama-arch target)."""
    native = pytest.importorskip("tfm_local.llama.native")
    tgt = synth.write_tiny_target(tmp_path / "t.gguf", arch="llama", n_layer=N_LAYER, seed=2)
    out, _ = init_random(tgt, tmp_path / "d.gguf", outtype="f16")
    tmodel, dmodel = synth.load_model(tgt), synth.load_model(out)
    tctx = synth.new_context(tmodel)
    dctx = None
    try:
        layers = native.model_target_layers(dmodel)
        assert max(layers) <= N_LAYER - 1
        for il in layers:
            native.set_layer_inp(tctx, il, True)
        toks = synth.tokenize(tmodel, "the dog says hello to the fox")
        synth.decode_tokens(tctx, toks)
        feats = np.concatenate([native.get_layer_inp(tctx, il, len(toks), 64) for il in layers], axis=1)
        assert feats.shape == (len(toks), len(layers) * 64) and np.isfinite(feats).all()
        assert np.abs(feats[:, :64] - feats[:, -64:]).max() > 1e-3  # different layers, different features
        dctx = synth.new_context(dmodel, n_batch=32, ctx_other=tctx)
        lc.llama_set_causal_attn(dctx, False)
        synth.decode_embeddings(dctx, feats[:-1], 0)
        mask = lc.llama_vocab_mask(lc.llama_model_get_vocab(dmodel))
        logits = synth.decode_tokens(dctx, [toks[-1]] + [mask] * 15, len(toks) - 1)
        assert logits.shape == (16, lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(tmodel)))
        assert np.isfinite(logits).all()
    finally:
        if dctx is not None:
            lc.llama_free(dctx)
        lc.llama_free(tctx)
        lc.llama_model_free(dmodel)
        lc.llama_model_free(tmodel)


def test_tensor_types_pick_a_type_per_tensor(tmp_path, wide):
    """--tensor-type REGEX=TYPE: the matching tensors take TYPE (first match wins), the rest --outtype;
    Q6_K's bytes decode closer to the weights than Q4_K's; a bad spec is a clear error, nothing written."""
    tgt, hf = wide
    out = tmp_path / "mix.gguf"
    assert main([str(hf), "--target", str(tgt), "-o", str(out), "--outtype", "q4_k",
                 "--tensor-type", "ffn_down=q6_k", "--tensor-type", "ffn_=q5_k"]) == 0
    kinds = {x.name: x.tensor_type.name for x in gguf.GGUFReader(out).tensors if len(x.shape) > 1}
    assert {k for k, v in kinds.items() if v == "Q6_K"} == {k for k in kinds if "ffn_down" in k} != set()
    assert {k for k, v in kinds.items() if v == "Q5_K"} == {k for k in kinds if "ffn_gate" in k or "ffn_up" in k}
    assert {v for k, v in kinds.items() if "ffn_" not in k} == {"Q4_K"}
    for spec in ("ffn_down", "ffn=q9_9", "ffn[=q6_k"):
        with pytest.raises(SystemExit):
            main([str(hf), "--target", str(tgt), "-o", str(tmp_path / "bad.gguf"), "--tensor-type", spec])
        assert not (tmp_path / "bad.gguf").exists()
    with pytest.raises(SystemExit):  # a pattern matching no tensor is a mistake, not a no-op
        main([str(hf), "--target", str(tgt), "-o", str(tmp_path / "bad.gguf"), "--tensor-type", "ffn_dwon=q6_k"])
    assert not (tmp_path / "bad.gguf").exists()
    from tfm_convert.quant import parse_tensor_types
    for spec, msg in (("ffn_down", "REGEX=TYPE"), ("ffn=q9_9", "not one of"), ("ffn[=q6_k", "regular expression")):
        with pytest.raises(ValueError, match=msg):
            parse_tensor_types([spec])


def test_k_quant_errors_shrink_with_bits():
    """ggml's Q4_K, Q5_K, Q6_K of the same rows: each more bits, less error (gguf decodes them)."""
    from tfm_convert.ggml_quant import quantize

    a = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    errs = [float(np.abs(gguf.quants.dequantize(quantize(a, qt), qt) - a).mean())
            for qt in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K, gguf.GGMLQuantizationType.Q6_K)]
    assert errs[0] > 1.5 * errs[1] > 0 and errs[1] > 1.5 * errs[2] > 0
