"""strip_vocab / attach_vocab: a vocabulary-less drafter regains the target's tokenizer, bytes unchanged."""
import numpy as np
import pytest

from tfm_convert.errors import ConvertError
from tfm_local.files.gguf_meta import read_gguf_meta
from tfm_convert.pipeline import init_random
from tfm_convert.vocab import attach_vocab, strip_vocab

from tfm_local.testing.synth import write_tiny_target


def test_strip_then_attach_round_trip(tmp_path):
    target = write_tiny_target(tmp_path / "t.gguf", n_layer=3)
    drafter, _ = init_random(target, tmp_path / "d.gguf", outtype="q8_0")
    bare = strip_vocab(drafter, tmp_path / "bare.gguf")
    full = attach_vocab(bare, target, tmp_path / "full.gguf")
    m0, mb, m1 = (read_gguf_meta(p) for p in (drafter, bare, full))
    assert not [k for k in mb.kv if k.startswith("tokenizer.") and k != "tokenizer.ggml.mask_token_id"]
    assert mb.kv["tokenizer.ggml.mask_token_id"].value == m0.kv["tokenizer.ggml.mask_token_id"].value
    assert {k: v.value for k, v in m1.kv.items()} == {k: v.value for k, v in m0.kv.items()}
    b0, b1 = drafter.read_bytes(), full.read_bytes()
    for t0, t1 in zip(m0.tensors, m1.tensors):
        assert (t0.name, t0.ne, t0.ggml_type) == (t1.name, t1.ne, t1.ggml_type)
        assert b0[t0.begin:t0.begin + t0.nbytes] == b1[t1.begin:t1.begin + t1.nbytes]
    from tfm_local.decode.draft import DFlashDrafter
    from tfm_local.decode.verify import Target

    tg = Target(target, n_ctx=128, n_batch=64)
    d = DFlashDrafter(full, tg)
    assert np.isfinite(d.marginals(5, 0, 4)).all()


def test_attach_refuses_a_target_without_tokenizer(tmp_path):
    target = write_tiny_target(tmp_path / "t.gguf", n_layer=3)
    drafter, _ = init_random(target, tmp_path / "d.gguf")
    bare = strip_vocab(drafter, tmp_path / "bare.gguf")
    with pytest.raises(ConvertError, match="no tokenizer"):
        attach_vocab(bare, bare, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_an_explicit_vocabulary_less_drafter_gets_the_targets_tokenizer(tmp_path, monkeypatch):
    """``--drafter <file>.novocab.gguf`` (as shipped in tfm_local/assets) works like ``--drafter auto``:
    resolve_drafter attaches the target's tokenizer into the cache once; drafters that have one, and
    files that are not GGUF (llama.cpp reports those), are used as given."""
    from tfm_local.decode.draft import DFlashDrafter
    from tfm_local.files.drafters import resolve_drafter
    from tfm_local.decode.verify import Target

    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    target = write_tiny_target(tmp_path / "t.gguf", n_layer=3)
    drafter, _ = init_random(target, tmp_path / "d.gguf")
    bare = strip_vocab(drafter, tmp_path / "d.novocab.gguf")
    got = resolve_drafter(bare, target)
    assert got.parent == tmp_path / "cache" / "drafters" and got.name.startswith("d-")
    assert "tokenizer.ggml.model" in read_gguf_meta(got).kv
    mtime = got.stat().st_mtime_ns
    assert resolve_drafter(bare, target) == got and got.stat().st_mtime_ns == mtime  # attached once
    assert np.isfinite(DFlashDrafter(got, Target(target, n_ctx=128, n_batch=64)).marginals(5, 0, 4)).all()
    assert resolve_drafter(drafter, target) == drafter
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(12))  # a GGUF magic, then nothing readable: left to llama.cpp's load
    assert resolve_drafter(junk, target) == junk


def test_a_drafter_given_as_the_target_is_named_as_such(tmp_path):
    """A DFlash drafter (with or without vocabulary) in the target's place gets an error that says so,
    not "corrupt, truncated or unsupported"."""
    from tfm_local.llama.model import LlamaError
    from tfm_local.decode.verify import Target

    target = write_tiny_target(tmp_path / "t.gguf", n_layer=3)
    drafter, _ = init_random(target, tmp_path / "d.gguf")
    for path in (drafter, strip_vocab(drafter, tmp_path / "bare.gguf")):
        with pytest.raises(LlamaError, match="is a DFlash drafter, not a"):
            Target(path, n_ctx=64, n_batch=32)
