"""The synthetic tiny targets: deterministic files, a working tokenizer, usable logits."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

import gguf
from tfm_local.testing import synth


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = synth.write_tiny_target(tmp_path / "a.gguf", seed=7)
    b = synth.write_tiny_target(tmp_path / "b.gguf", seed=7)
    c = synth.write_tiny_target(tmp_path / "c.gguf", seed=8)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)


def test_vocabulary_layout(tmp_path):
    path = synth.write_tiny_target(tmp_path / "t.gguf")
    r = gguf.GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    b2u = synth.byte_to_unicode()
    assert tokens[:256] == [b2u[b] for b in range(256)]
    assert len(set(tokens)) == len(tokens)
    assert len(merges) >= 24
    for m in merges:  # every merge joins two existing tokens into an existing token
        left, right = m.split(" ")
        assert left in tokens and right in tokens and left + right in tokens
    eos = r.fields["tokenizer.ggml.eos_token_id"].contents()
    assert tokens[eos] == "<|im_end|>" and types[eos] == int(gguf.TokenType.CONTROL)
    unused = [i for i, t in enumerate(types) if t == int(gguf.TokenType.UNUSED)]
    assert unused and unused == list(range(len(tokens) - len(unused), len(tokens)))
    assert 300 <= len(tokens) <= 400
    assert r.fields["tokenizer.chat_template"].contents() == synth.CHATML_TEMPLATE


def test_n_vocab_option(tmp_path):
    path = synth.write_tiny_target(tmp_path / "t.gguf", n_vocab=384)
    r = gguf.GGUFReader(path)
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 384
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    assert emb.data.shape == (384, 64)
    with pytest.raises(ValueError):
        synth.write_tiny_target(tmp_path / "u.gguf", n_vocab=100)


def test_learn_merges_prefers_frequent_pairs():
    merges = synth.learn_merges("abab abab abab cd", 3)
    assert merges[0] == ("a", "b")
    assert ("c", "d") not in merges  # occurs once: never merged


@pytest.fixture(scope="module")
def lc():
    return pytest.importorskip("llama_cpp")


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3"])
def test_loads_runs_and_logits_are_spread(tmp_path, lc, arch):
    path = synth.write_tiny_target(tmp_path / f"{arch}.gguf", arch=arch, n_layer=3, seed=1)
    model = synth.load_model(path)
    ctx = synth.new_context(model)
    try:
        vocab = lc.llama_model_get_vocab(model)
        assert lc.llama_vocab_n_tokens(vocab) == synth.TinyVocab().n_vocab
        assert lc.llama_model_n_layer(model) == 3 and lc.llama_model_n_embd(model) == 64
        text = "hello world"
        toks = synth.tokenize(model, text)
        assert 1 < len(toks) < len(text.encode())  # merges applied
        logits = synth.decode_tokens(ctx, toks)
        assert logits.shape == (len(toks), lc.llama_vocab_n_tokens(vocab))
        assert np.isfinite(logits).all()
        std = logits.std(axis=1)
        assert (std > 1.0).all() and (std < 10.0).all()
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        assert (p.max(axis=1) < 0.9).all()  # not one-hot
        assert (p.max(axis=1) > 5.0 / p.shape[1]).all()  # not flat
    finally:
        lc.llama_free(ctx)
        lc.llama_model_free(model)


def test_gemma3_sliding_window_is_active(tmp_path, lc):
    """Same weights, a 4-token window vs one longer than the text: equal logits in the first window only."""
    text = "the quick brown fox jumps over the lazy dog"
    out = {}
    for n_swa in (4, 4096):  # a window longer than the text never binds
        model = synth.load_model(synth.write_tiny_target(tmp_path / f"g{n_swa}.gguf", arch="gemma3", n_layer=3,
                                                         seed=2, n_swa=n_swa, swa_pattern=3))
        ctx = synth.new_context(model)
        try:
            out[n_swa] = synth.decode_tokens(ctx, synth.tokenize(model, text))
        finally:
            lc.llama_free(ctx)
            lc.llama_model_free(model)
    diff = np.abs(out[4] - out[4096]).max(axis=1)
    assert len(diff) > 8
    assert (diff[:4] < 1e-3).all()
    assert (diff[4:] > 0.05).all()


def test_logits_depend_on_context(tmp_path, lc):
    model = synth.load_model(synth.write_tiny_target(tmp_path / "t.gguf"))
    try:
        last = {}
        for prefix in ("the dog", "a fox"):
            ctx = synth.new_context(model)
            toks = synth.tokenize(model, prefix + " says hello")
            last[prefix] = synth.decode_tokens(ctx, toks)[-1]
            lc.llama_free(ctx)
        assert np.abs(last["the dog"] - last["a fox"]).max() > 0.1
    finally:
        lc.llama_model_free(model)


@pytest.mark.parametrize("text", ["hello world", "  tabs\tand\nnewlines ", "héllo wörld ✓ 42!",
                                  "<|im_start|>user\nhi<|im_end|>\n"])
def test_tokenizer_round_trip(tmp_path, lc, text):
    model = synth.load_model(synth.write_tiny_target(tmp_path / "t.gguf"))
    try:
        toks = synth.tokenize(model, text, parse_special=True)
        assert synth.detokenize(model, toks) == text
        vocab = synth.TinyVocab()
        if "<|im_start|>" in text:
            assert vocab.special["<|im_start|>"] in toks and vocab.special["<|im_end|>"] in toks
        eos = lc.llama_vocab_eos(lc.llama_model_get_vocab(model))
        assert eos == vocab.special["<|im_end|>"]
        assert lc.llama_vocab_is_eog(lc.llama_model_get_vocab(model), eos)
    finally:
        lc.llama_model_free(model)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next"])
def test_hybrid_layout_loads_and_decodes(tmp_path, arch):
    """The tiny Gated DeltaNet hybrids: both layer kinds, H_v > H_k (and 4 experts, 2 used here so
    that the router's top-k selection runs, a shared expert for the MoE archs); batch decoding equals
    token-by-token decoding (on the CPU; a router near-tie could part them on a GPU)."""
    path = synth.write_tiny_hybrid(tmp_path / f"{arch}.gguf", arch=arch, n_layer=2, seed=3, n_expert_used=2)
    r = gguf.GGUFReader(path)
    assert r.fields["general.architecture"].contents() == arch
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}  # GGUF ne order
    assert shapes["blk.0.attn_qkv.weight"] == (64, 2 * 16 * 2 + 16 * 4)      # q, k: H_k = 2; v: H_v = 4
    assert shapes["blk.0.ssm_conv1d.weight"] == (4, 2 * 16 * 2 + 16 * 4)
    assert shapes["blk.1.attn_q.weight"] == (64, 2 * 4 * 16)                # query + output gate
    assert "blk.0.attn_q.weight" not in shapes and "blk.1.ssm_a" not in shapes
    if arch == "qwen3next":
        assert shapes["blk.0.ssm_ba.weight"] == (64, 2 * 4) and "blk.0.ssm_beta.weight" not in shapes
        assert f"{arch}.rope.dimension_sections" not in r.fields
    else:
        assert shapes["blk.0.ssm_beta.weight"] == shapes["blk.0.ssm_alpha.weight"] == (64, 4)
    if arch == "qwen35":
        assert shapes["blk.0.ffn_down.weight"] == (128, 64) and "blk.0.ffn_gate_inp.weight" not in shapes
    else:
        assert r.fields[f"{arch}.expert_count"].contents() == 4
        assert r.fields[f"{arch}.expert_used_count"].contents() == 2
        assert shapes["blk.0.ffn_gate_inp.weight"] == (64, 4)
        assert shapes["blk.1.ffn_up_exps.weight"] == (64, 32, 4)
        assert shapes["blk.1.ffn_down_exps.weight"] == (32, 64, 4)
        assert shapes["blk.0.ffn_gate_inp_shexp.weight"] == (64,)
        assert shapes["blk.0.ffn_down_shexp.weight"] == (64, 64)
        assert "blk.0.ffn_down.weight" not in shapes
    lc = synth.llama_cpp_lib()
    model = synth.load_model(path)
    ctx = synth.new_context(model)
    ctx2 = synth.new_context(model)
    try:
        toks = synth.tokenize(model, "hello world. the quick brown fox")
        full = synth.decode_tokens(ctx, toks)
        rows = np.stack([synth.decode_tokens(ctx2, [t], i)[0] for i, t in enumerate(toks)])
        assert np.isfinite(full).all() and 1.0 < full.std() < 10.0
        assert np.abs(rows - full).max() < 1e-3 * np.abs(full).max()
    finally:
        lc.llama_free(ctx)
        lc.llama_free(ctx2)
        lc.llama_model_free(model)
