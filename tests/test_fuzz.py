"""Damaged model files end in a clear error, never a crash or a hang (tfm_local/testing/fuzz.py).

Every mutant is loaded in a child process (``LoadWorker``), the way a user's process would load it:
a target (``Target`` + a 3-token prefill; qwen2, the qwen35 hybrid, gemma3), a drafter (an ``Engine``
with a good target), the metadata reader the converter and the trainer use, and z-lab checkpoints
(``config.json`` + ``model.safetensors``) into ``tfm-convert``'s conversion, which must also leave no
file behind when it fails. The damage covers truncation, flipped bytes in header and data, wrong counts,
lengths, types, dimensions and offsets, duplicated or missing keys and tensors, and odd config values.
DFlash2 drafters and checkpoints are fuzzed as the DFlash ones, and drafter GGUFs also go through
``tfm-convert``'s requantize path (a failure leaves no file either). Fixed seeds; ``FILES_PER_RUN``
files a run (2,500).
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

from tfm_local.files.gguf_meta import GGUFError
from tfm_local.testing.fuzz import MUTATIONS, gguf_layout, mutate_gguf, run

#: (kind, model, mutants, seed): DFlash and DFlash2 drafters (GGUF, loaded by the engine and requantized)
#: and z-lab checkpoints of both; ~7 minutes on the 2-core CPU, nearly all of it the 850 files loaded by
#: llama.cpp (~0.4 s each: a process's model load and a short generation); the converter's take ~10 ms
PLAN = [("meta", "target", 350, 11), ("target", "target", 350, 12), ("target", "qwen35", 150, 13),
        ("target", "gemma3", 100, 14), ("drafter", "drafter", 150, 15), ("drafter", "drafter2", 100, 17),
        ("zlab", "checkpoint", 400, 16), ("zlab", "checkpoint2", 300, 18),
        ("requantize", "drafter", 300, 19), ("requantize", "drafter2", 300, 20)]

#: files fuzzed per CI run (2,500; the bar: at least 1,750, and 200 DFlash2 checkpoints and 200 requantize
#: inputs: ``test_the_plan_fuzzes_enough_files``)
FILES_PER_RUN = sum(n for _, _, n, _ in PLAN)


def test_the_plan_fuzzes_enough_files():
    assert FILES_PER_RUN >= 1750
    assert sum(n for k, m, n, _ in PLAN if k == "zlab" and m == "checkpoint2") >= 200
    assert sum(n for k, m, n, _ in PLAN if k == "drafter" and m == "drafter2") >= 100
    assert sum(n for k, _, n, _ in PLAN if k == "requantize") >= 200
    assert len({seed for *_, seed in PLAN}) == len(PLAN)  # each part its own mutants


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from tfm_convert.pipeline import init_random
    from tfm_local.testing.synth import write_tiny_target

    d = tmp_path_factory.mktemp("fuzz")
    out = {"target": write_tiny_target(d / "target.gguf", n_layer=2),
           "qwen35": write_tiny_target(d / "qwen35.gguf", arch="qwen35"),
           "gemma3": write_tiny_target(d / "gemma3.gguf", arch="gemma3")}
    out["drafter"], out["checkpoint"] = init_random(out["target"], d / "drafter.gguf", hf_out=d / "checkpoint",
                                                    layers=1, seed=4)
    out["drafter2"], out["checkpoint2"] = init_random(out["target"], d / "drafter2.gguf", hf_out=d / "checkpoint2",
                                                      layers=1, seed=4, dflash2=True)
    return out


def test_layout_maps_every_field(files):
    buf = files["target"].read_bytes()
    lay = gguf_layout(buf)
    assert len(lay.kvs) == struct.unpack_from("<Q", buf, 16)[0] and len(lay.tensors) == struct.unpack_from("<Q", buf, 8)[0]
    assert lay.data_start % lay.alignment == 0 and lay.header_end <= lay.data_start < len(buf)
    arch = next(f for f in lay.kvs if f.name == "general.architecture")
    n = struct.unpack_from("<Q", buf, arch.parts["str_len"])[0]
    assert buf[arch.parts["str_len"] + 8:arch.parts["str_len"] + 8 + n] == b"qwen2"
    rng = np.random.default_rng(0)
    kinds = {mutate_gguf(buf, rng, lay)[0].split(" ")[0] for _ in range(400)}
    assert len(kinds) >= 12  # the mutations come out varied
    assert "truncate" in MUTATIONS and "dup_tensor" in MUTATIONS


@pytest.mark.parametrize("key,value,fmt,match", [
    ("qwen2.block_count", 0, "<I", "block_count"),
    ("qwen2.attention.layer_norm_rms_epsilon", 0x7FC00000, "<I", "finite"),
    ("qwen2.attention.head_count_kv", 3, "<I", "does not divide"),
])
def test_values_llama_cpp_would_abort_on_are_refused_first(files, tmp_path, key, value, fmt, match):
    """Found by fuzzing: each of these made llama.cpp abort the process (GGML_ASSERT, SIGABRT)."""
    from tfm_local.llama.model import Model

    buf = bytearray(files["target"].read_bytes())
    f = next(k for k in gguf_layout(bytes(buf)).kvs if k.name == key)
    struct.pack_into(fmt, buf, f.parts["value"], value)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(buf))
    with pytest.raises(GGUFError, match=match) as e:
        Model(bad, n_gpu_layers=0)
    assert "bad.gguf" in str(e.value)


def test_a_token_twice_in_the_vocabulary_is_refused(files, tmp_path):
    buf = bytearray(files["target"].read_bytes())
    f = next(k for k in gguf_layout(bytes(buf)).kvs if k.name == "tokenizer.ggml.tokens")
    at = f.parts["first_len"]
    n = struct.unpack_from("<Q", buf, at)[0]
    second = at + 8 + n
    m = struct.unpack_from("<Q", buf, second)[0]
    if m == n:  # make the second token equal to the first
        buf[second + 8:second + 8 + m] = buf[at + 8:at + 8 + n]
    else:
        pytest.skip("the first two tokens differ in length")
    bad = tmp_path / "dup.gguf"
    bad.write_bytes(bytes(buf))
    from tfm_local.llama.model import Model

    with pytest.raises(GGUFError, match="twice"):
        Model(bad, n_gpu_layers=0)


def test_a_file_that_aborts_llama_cpp_is_caught_by_the_probe(files, tmp_path, monkeypatch):
    """A qwen35 state size that does not fit its tensors aborts llama.cpp while it builds the graph; the
    quick checks do not know it, the child-process probe does (and nothing is remembered for it)."""
    import json

    from tfm_local.llama.model import Model

    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    buf = bytearray(files["qwen35"].read_bytes())
    f = next(k for k in gguf_layout(bytes(buf)).kvs if k.name == "qwen35.ssm.inner_size")
    struct.pack_into("<I", buf, f.parts["value"], 2)
    bad = tmp_path / "ssm.gguf"
    bad.write_bytes(bytes(buf))
    with pytest.raises(GGUFError, match="aborts") as e:
        Model(bad, n_gpu_layers=0)
    assert "ssm.gguf" in str(e.value)
    good = Model(files["qwen35"], n_gpu_layers=0)  # and a good file passes, once
    good.close()
    seen = json.loads((tmp_path / "cache" / "probed.json").read_text())
    assert len(seen) == 1 and str(files["qwen35"].resolve()) in next(iter(seen))


def test_damaged_files_end_in_clear_errors(files, tmp_path):
    total, report = 0, []
    for kind, model, n, seed in PLAN:
        rep = run(kind, files[model], n, seed, tmp_path, extra=str(files["target"]), timeout=60)
        total += rep["files"]
        report.append((kind, model, rep["counts"], rep["bad"][:3]))
    assert total == FILES_PER_RUN  # no run stopped early
    bad = [r for r in report if r[3]]
    assert not bad, bad  # no crash, hang, unclear error or partial output
    assert all(r[2].get("error", 0) > 0.5 * sum(r[2].values()) for r in report if r[0] != "meta"), report


@pytest.mark.parametrize("path,value,match", [
    (("num_hidden_layers",), 2 ** 63, "32 bits"),            # made the tensor check run for ever
    (("num_hidden_layers",), 4096, "exceeds 512"),
    (("rms_norm_eps",), 1e308, "positive finite"),            # overflowed the GGUF's f32 field
    (("architectures",), 1, "must be a list"),
    (("max_position_embeddings",), -1, "must not be negative"),  # overflowed a u32 field
    (("num_attention_heads",), 3, "tensors do not match"),    # a check that did not name the checkpoint
])
def test_damaged_checkpoint_configs_found_by_fuzzing_are_clear(files, tmp_path, path, value, match):
    import json
    import shutil

    from tfm_convert.errors import ConvertError
    from tfm_convert.pipeline import convert_checkpoint

    ck = tmp_path / "ck"
    shutil.copytree(files["checkpoint"], ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg[path[0]] = value
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match=match) as e:
        convert_checkpoint(ck, files["target"], ck / "out.gguf")
    assert str(ck) in str(e.value) and sorted(p.name for p in ck.iterdir()) == ["config.json", "model.safetensors"]


def test_damaged_checkpoint_weights_found_by_fuzzing_are_clear(files, tmp_path):
    import json
    import shutil

    from tfm_convert.errors import ConvertError
    from tfm_convert.pipeline import convert_checkpoint
    from tfm_local.testing.fuzz import _safetensors, _safetensors_parts

    for damage, match in (("dtype", "dtype"), ("nan", "not finite")):
        ck = tmp_path / damage
        shutil.copytree(files["checkpoint"], ck)
        st = (ck / "model.safetensors").read_bytes()
        n, header = _safetensors_parts(st)
        data = bytearray(st[8 + n:])
        name = next(k for k in header if k != "__metadata__")
        if damage == "dtype":
            header[name]["dtype"] = [3]  # unhashable: a TypeError before
        else:
            begin = header[name]["data_offsets"][0]
            data[begin:begin + 4] = np.float32(np.nan).tobytes()
        (ck / "model.safetensors").write_bytes(_safetensors(header, bytes(data)))
        with pytest.raises(ConvertError, match=match) as e:
            convert_checkpoint(ck, files["target"], ck / "out.gguf")
        assert "model.safetensors" in str(e.value) and not (ck / "out.gguf").exists()
        assert json.loads((ck / "config.json").read_text())  # the input is untouched


@pytest.mark.parametrize("model,key,value", [
    ("drafter", "dflash.attention.head_count", 0),       # ZeroDivisionError
    ("drafter", "dflash.block_count", 1 << 31),          # the shapes of 2**31 layers: a hang
    ("drafter2", "dflash.conv_group_size", 0),           # ZeroDivisionError
    ("drafter2", "dflash.conv_group_size", None),        # the key missing: 0, ZeroDivisionError
])
def test_damaged_drafters_found_by_fuzzing_the_requantize_path_are_clear(files, tmp_path, model, key, value):
    """Found by fuzzing the requantize path (a drafter GGUF written again by tfm-convert): each of these
    raised an internal error or ran for ever; now one line naming the file, and no output."""
    from tfm_convert.errors import ConvertError
    from tfm_convert.pipeline import convert_checkpoint
    from tfm_local.testing.fuzz import _rebuilt

    buf = files[model].read_bytes()
    lay = gguf_layout(buf)
    f = next(k for k in lay.kvs if k.name == key)
    if value is None:
        header = buf[24:f.start] + buf[f.end:lay.header_end]
        buf = _rebuilt(buf, lay, header, len(lay.kvs) - 1, len(lay.tensors))
    else:
        buf = bytearray(buf)
        struct.pack_into("<I", buf, f.parts["value"], value)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(buf))
    with pytest.raises(ConvertError, match="invalid drafter config") as e:
        convert_checkpoint(bad, files["target"], tmp_path / "out.gguf", "q8_0")
    assert "bad.gguf" in str(e.value) and "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_weights_beyond_float16_name_the_checkpoint_file(files, tmp_path):
    """Found by fuzzing: flipped weight bytes beyond the float16 range, converted to Q8_0, were refused by
    a message that named the tensor but not the file it came from."""
    import shutil

    from tfm_convert.errors import ConvertError
    from tfm_convert.pipeline import convert_checkpoint
    from tfm_local.testing.fuzz import _safetensors, _safetensors_parts

    ck = tmp_path / "ck"
    shutil.copytree(files["checkpoint2"], ck)
    st = (ck / "model.safetensors").read_bytes()
    n, header = _safetensors_parts(st)
    data = bytearray(st[8 + n:])
    name = next(k for k in header if k.endswith("mlp.up_proj.weight"))
    b0 = header[name]["data_offsets"][0]
    assert header[name]["dtype"] == "F32"
    data[b0:b0 + 4] = np.float32(7e4).tobytes()
    (ck / "model.safetensors").write_bytes(_safetensors(header, bytes(data)))
    with pytest.raises(ConvertError, match="float16 range") as e:
        convert_checkpoint(ck, files["target"], ck / "out.gguf", "q8_0")
    assert str(ck / "model.safetensors") in str(e.value) and name in str(e.value)
    assert sorted(p.name for p in ck.iterdir()) == ["config.json", "model.safetensors"]


def test_review_findings_on_damaged_inputs_are_clear(files, tmp_path):
    """Found by a review after the fuzz runs: an alignment of 0 or an array (ZeroDivisionError,
    TypeError), a conversion whose output is one of its inputs (it replaced the target), checkpoint
    entries with negative or string offsets, a huge shape, a config nested past the recursion limit,
    and weights beyond the float16 range in an F16 output (they became infinite)."""
    import json
    import shutil

    import gguf

    from tfm_convert.errors import ConvertError
    from tfm_convert.pipeline import convert_checkpoint
    from tfm_local.files.gguf_meta import read_gguf_meta
    from tfm_local.testing.fuzz import _safetensors, _safetensors_parts

    for value in (0, [32, 32]):
        p = tmp_path / f"align-{len(str(value))}.gguf"
        w = gguf.GGUFWriter(str(p), "qwen2")
        (w.add_array if isinstance(value, list) else w.add_uint32)("general.alignment", value)
        w.add_tensor("x", np.zeros(4, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(GGUFError, match="alignment") as e:
            read_gguf_meta(p)
        assert p.name in str(e.value)

    target = tmp_path / "t.gguf"
    shutil.copy(files["target"], target)
    before = target.read_bytes()
    with pytest.raises(ConvertError, match="is an input"):
        convert_checkpoint(files["checkpoint"], target, target)
    ck = tmp_path / "ck"
    shutil.copytree(files["checkpoint"], ck)
    with pytest.raises(ConvertError, match="is an input"):
        convert_checkpoint(ck, target, ck / "model.safetensors")
    assert target.read_bytes() == before and sorted(p.name for p in ck.iterdir()) == ["config.json", "model.safetensors"]

    st = (ck / "model.safetensors").read_bytes()
    n, header = _safetensors_parts(st)
    name = next(k for k in header if k != "__metadata__")
    for field_, value in (("data_offsets", [-64, -64 + header[name]["data_offsets"][1] - header[name]["data_offsets"][0]]),
                          ("data_offsets", ["0", "8"]), ("shape", [2 ** 70, 1]), ("shape", [1.5e300])):
        bad = json.loads(json.dumps(header))
        bad[name][field_] = value
        (ck / "model.safetensors").write_bytes(_safetensors(bad, st[8 + n:]))
        with pytest.raises(ConvertError, match="model.safetensors"):
            convert_checkpoint(ck, target, tmp_path / "out.gguf")
    (ck / "model.safetensors").write_bytes(st)
    cfg = (ck / "config.json").read_text()
    (ck / "config.json").write_text("[" * 200000)
    with pytest.raises(ConvertError, match="config.json"):
        convert_checkpoint(ck, target, tmp_path / "out.gguf")
    (ck / "config.json").write_text(cfg)

    big = json.loads(json.dumps(header))  # a weight of 1e30: F16 cannot hold it
    data = bytearray(st[8 + n:])
    mat = next(k for k in big if k != "__metadata__" and len(big[k]["shape"]) == 2)
    b0 = big[mat]["data_offsets"][0]
    if big[mat]["dtype"] == "F32":
        data[b0:b0 + 4] = np.float32(1e30).tobytes()
    else:  # BF16: the top half of the float32
        data[b0:b0 + 2] = np.float32(1e30).tobytes()[2:]
    (ck / "model.safetensors").write_bytes(_safetensors(big, bytes(data)))
    with pytest.raises(ConvertError, match="float16 range"):
        convert_checkpoint(ck, target, tmp_path / "out.gguf", "f16")
    assert not (tmp_path / "out.gguf").exists()


def test_a_file_written_in_place_is_probed_again(files, tmp_path, monkeypatch):
    """A file that passed the probe and was then rewritten in place, with its size and modification
    time set back (found by the review: block_count 0 then aborted the process): the change time is
    part of the key, so the file is probed (and checked) again."""
    import os
    import shutil
    import time

    from tfm_local.llama import probe

    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "m.gguf"
    shutil.copy(files["target"], p)
    probe.probe_model(p)
    assert probe.passed(p)
    st = p.stat()
    time.sleep(0.01)
    with open(p, "r+b") as f:  # the same bytes, written in place
        f.write(p.read_bytes()[:16])
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_mtime_ns == st.st_mtime_ns and p.stat().st_size == st.st_size
    assert not probe.passed(p)


def test_a_fifo_in_a_checkpoint_is_refused_not_waited_on(files, tmp_path):
    import os
    import shutil

    from tfm_convert.errors import ConvertError
    from tfm_convert.pipeline import convert_checkpoint

    for name in ("model.safetensors", "config.json"):
        ck = tmp_path / name.split(".")[0]
        shutil.copytree(files["checkpoint"], ck)
        (ck / name).unlink()
        os.mkfifo(ck / name)
        with pytest.raises(ConvertError, match="not a regular file"):
            convert_checkpoint(ck, files["target"], tmp_path / "out.gguf")
