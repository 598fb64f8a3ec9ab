"""The random-init drafter of a target without a shipped one (``--drafter auto``), also for a vocabulary
without UNUSED padding tokens (SmolLM2's), where the converter's MASK pick has nothing to choose from."""
import gguf

from tfm_local.files.gguf_meta import GGUFKeyValue, read_gguf_meta
from tfm_local.testing.synth import write_tiny_target


def without_unused_tokens(target, out):
    """A copy of ``target`` whose UNUSED tokens are typed CONTROL, but for the last, typed NORMAL (tensors
    unchanged)."""
    from tfm_convert.vocab import rewrite_gguf

    meta = read_gguf_meta(target)
    kvs = []
    for kv in meta.kv.values():
        if kv.key == "tokenizer.ggml.token_type":
            types = list(kv.value)
            unused = [i for i, t in enumerate(types) if t == int(gguf.TokenType.UNUSED)]
            for i in unused:
                types[i] = int(gguf.TokenType.CONTROL)
            types[unused[-1]] = int(gguf.TokenType.NORMAL)
            kv = GGUFKeyValue(kv.key, types, kv.vtype, kv.sub_type)
        kvs.append(kv)
    return rewrite_gguf(target, meta, kvs, out), unused


def test_auto_drafter_for_a_vocabulary_without_unused_tokens(tmp_path, monkeypatch):
    from tfm_local.engine import Engine

    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    target, padded = without_unused_tokens(write_tiny_target(tmp_path / "t.gguf"), tmp_path / "no-unused.gguf")
    with Engine(target, "auto", n_ctx=256, budget=3, n_threads=1) as engine:
        assert engine.drafter.mask_token == padded[-2]  # the last CONTROL token that is no named special token
        text = engine.generate("hello", max_tokens=8)
    with Engine(target, None, n_ctx=256, n_threads=1) as plain:
        assert text == plain.generate("hello", max_tokens=8)
