"""Tiny synthetic GGUF models for fast unit tests.

``write_tiny_target`` writes a random-weight decoder (arch ``qwen2``,
``llama`` or ``gemma3``, the last with a few-token sliding window on some
layers; or a Gated-DeltaNet hybrid ``qwen35``, ``qwen35moe`` or ``qwen3next``, see
``write_tiny_hybrid``) that llama.cpp loads and runs in milliseconds, with a small
byte-level BPE tokenizer built here: the 256 byte tokens, merges learned
from a short built-in text, the ChatML special tokens and a few unused
padding ids at the end of the vocabulary (token type UNUSED, the way
Hugging Face conversions pad a vocabulary).

Everything is deterministic for a given seed. The weights are drawn so that
the next-token distribution is neither flat nor one-hot (logits with a
standard deviation of a few units), so tests can sample from it.

Tensor shapes below are given in numpy (row-major) order, which is GGUF's
``ne`` reversed: ``token_embd.weight`` is ``(n_vocab, n_embd)`` float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf
from .hybrid import ARCHS as HYBRID_ARCHS
from .hybrid import ExpertShape, HybridShape, write_hybrid
from .vocab import (CHATML_TEMPLATE, SPECIAL_TOKENS, TinyVocab, byte_to_unicode,  # noqa: F401
                                   learn_merges)

_SUPPORTED_ARCHS = ("qwen2", "llama", "gemma3") + HYBRID_ARCHS

#: gemma3 scales the input embedding by sqrt(n_embd) and RMS-normalises every sub-layer output
#: (post-attention / post-FFN norms), so with unit norm weights the tied embedding of the current
#: token dominates the residual and the model mostly predicts that same token again. Post-norm
#: weights of about this size let the layers dominate, like the other synthetic archs.
GEMMA3_POST_NORM_GAIN = 8.0


def _common_hparams_to(writer: gguf.GGUFWriter, arch: str, *, n_layer: int, n_embd: int, n_head: int,
                       n_head_kv: int, n_ff: int, n_ctx_train: int, rope_base: float, name: str | None = None,
                       file_type: gguf.LlamaFileType = gguf.LlamaFileType.ALL_F32) -> None:
    """The keys every synthetic decoder has: name (default ``tfm-tiny-{arch}``), sizes, head counts, rope
    base, RMS eps, file type (default F32)."""
    writer.add_name(name or f"tfm-tiny-{arch}")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(file_type)


def _write_all(writer: gguf.GGUFWriter, vocab: "TinyVocab", tensors: dict[str, np.ndarray],
               chat_template: str) -> None:
    """Add the tokenizer and ``tensors`` to ``writer``, write the file and close it."""
    vocab.write_to(writer, chat_template)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _hparams_to(writer: gguf.GGUFWriter, arch: str, *, n_layer: int, n_embd: int, n_head: int,
                n_head_kv: int, n_ff: int, n_ctx_train: int, n_vocab: int, n_swa: int = 0,
                swa_pattern: int = 0) -> None:
    """Add the model hyper-parameters (``{arch}.*`` keys) to ``writer``."""
    _common_hparams_to(writer, arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                       n_ff=n_ff, n_ctx_train=n_ctx_train,
                       rope_base=10_000.0 if arch == "llama" else 1_000_000.0)
    if arch == "llama":
        writer.add_vocab_size(n_vocab)
        writer.add_rope_dimension_count(n_embd // n_head)
    if arch == "gemma3":
        _gemma3_hparams_to(writer, head_dim=n_embd // n_head, n_swa=n_swa, swa_pattern=swa_pattern)


def _gemma3_hparams_to(writer: gguf.GGUFWriter, *, head_dim: int, n_swa: int, swa_pattern: int) -> None:
    """The gemma3 keys: head size, sliding window and its layer pattern, local rope base.

    llama.cpp's gemma3 loader makes layer ``il`` a sliding-window layer when
    ``il % swa_pattern < swa_pattern - 1`` (so pattern 3 on 3 layers: 0 and 1
    windowed, 2 global; pattern 0: every layer windowed); a window of
    ``n_swa`` lets a token at position p see positions p - n_swa + 1 .. p.
    ``n_swa = 0`` writes no window (all layers global).
    """
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if n_swa > 0:
        writer.add_sliding_window(n_swa)
        writer.add_sliding_window_pattern(swa_pattern)
        writer.add_rope_freq_base_swa(10_000.0)


def _random_weights(rng: np.random.Generator, *, n_vocab: int, n_embd: int, logit_std: float):
    """Weight makers and the embedding / final norm of the tiny decoders.

    Returns ``(mat, norm, tensors)``: ``mat(rows, cols)`` draws a (rows, cols) float32 matrix
    N(0, 1/cols), ``norm(n)`` an RMSNorm weight ≈ 1; ``tensors`` holds ``token_embd.weight``
    (n_vocab, n_embd), rows of norm ≈ ``logit_std``, and ``output_norm.weight`` (n_embd).
    """
    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, np.ndarray] = {
        "token_embd.weight": (rng.standard_normal((n_vocab, n_embd)) * logit_std / np.sqrt(n_embd)).astype(np.float32),
        "output_norm.weight": norm(n_embd),
    }
    return mat, norm, t


def tiny_target_tensors(rng: np.random.Generator, arch: str, *, n_layer: int, n_embd: int,
                        n_head: int, n_head_kv: int, n_ff: int, n_vocab: int,
                        logit_std: float = 3.0) -> dict[str, np.ndarray]:
    """Random weights of a tied-embedding decoder, float32, numpy shape order.

    Projections are drawn N(0, 1/fan_in) so every sub-layer adds a residual
    update comparable to the embedding; the embedding rows have norm
    ``logit_std`` so that, after the final RMSNorm (weights ≈ 1), the logits
    ``E · norm(h)`` have a standard deviation of about ``logit_std``.

    Returns:
        dict GGUF tensor name → array; e.g. ``blk.0.attn_q.weight`` is
        (n_embd, n_embd), ``blk.0.attn_k.weight`` (n_head_kv·head_dim, n_embd),
        ``blk.0.ffn_down.weight`` (n_embd, n_ff); qwen2 adds q/k/v biases,
        gemma3 per-head q/k norms and post-attention / post-FFN norms.
    """
    head_dim = n_embd // n_head
    n_kv = n_head_kv * head_dim
    mat, norm, t = _random_weights(rng, n_vocab=n_vocab, n_embd=n_embd, logit_std=logit_std)
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(n_embd)
        t[p + "attn_q.weight"] = mat(n_embd, n_embd)
        t[p + "attn_k.weight"] = mat(n_kv, n_embd)
        t[p + "attn_v.weight"] = mat(n_kv, n_embd)
        if arch == "qwen2":
            t[p + "attn_q.bias"] = (0.1 * rng.standard_normal(n_embd)).astype(np.float32)
            t[p + "attn_k.bias"] = (0.1 * rng.standard_normal(n_kv)).astype(np.float32)
            t[p + "attn_v.bias"] = (0.1 * rng.standard_normal(n_kv)).astype(np.float32)
        t[p + "attn_output.weight"] = mat(n_embd, n_embd)
        t[p + "ffn_norm.weight"] = norm(n_embd)
        t[p + "ffn_gate.weight"] = mat(n_ff, n_embd)
        t[p + "ffn_up.weight"] = mat(n_ff, n_embd)
        t[p + "ffn_down.weight"] = mat(n_embd, n_ff)
        if arch == "gemma3":
            t[p + "attn_q_norm.weight"] = norm(head_dim)
            t[p + "attn_k_norm.weight"] = norm(head_dim)
            t[p + "post_attention_norm.weight"] = GEMMA3_POST_NORM_GAIN * norm(n_embd)
            t[p + "post_ffw_norm.weight"] = GEMMA3_POST_NORM_GAIN * norm(n_embd)
    return t


def write_tiny_target(path: str | Path, *, arch: str = "qwen2", n_layer: int = 2, n_embd: int = 64,
                      n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128, n_ctx_train: int = 2048,
                      seed: int = 0, n_vocab: int | None = None, n_swa: int = 4,
                      swa_pattern: int = 3, chat_template: str = CHATML_TEMPLATE) -> Path:
    """Write a random-weight target GGUF that llama.cpp loads and runs.

    Args:
        path: output file (overwritten).
        arch: "qwen2" (q/k/v biases, NeoX rope), "llama" or "gemma3" (q/k
            norms, sandwich norms, GELU FFN, sliding window on some layers),
            or a hybrid "qwen35", "qwen35moe", "qwen3next" (``write_tiny_hybrid`` with its
            default recurrent and expert sizes).
        n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx_train: model sizes;
            n_embd must be divisible by n_head, n_head by n_head_kv.
        seed: RNG seed; equal arguments give a byte-identical file.
        n_vocab: vocabulary size, padding included (default: see TinyVocab,
            320 with the built-in merges).
        n_swa, swa_pattern: gemma3 only: sliding window in tokens (0 = none)
            and its layer pattern (every swa_pattern-th layer is global, 0 =
            none is; see ``_gemma3_hparams_to``).
        chat_template: the Jinja chat template stored (default ChatML).

    Returns:
        the path written, as a Path. All tensors are F32, embeddings tied
        (no ``output.weight``, like Qwen2.5 0.5B/1.5B).

    Raises:
        ValueError: unsupported arch, inconsistent head counts or a
            negative window.
    """
    if arch not in _SUPPORTED_ARCHS:
        raise ValueError(f"arch must be one of {_SUPPORTED_ARCHS}, got {arch!r}")
    if arch in HYBRID_ARCHS:
        return write_tiny_hybrid(path, arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                                 n_head_kv=n_head_kv, n_ff=n_ff, n_ctx_train=n_ctx_train, seed=seed,
                                 n_vocab=n_vocab, chat_template=chat_template)
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be divisible by n_head and n_head by n_head_kv")
    if n_swa < 0 or swa_pattern < 0:
        raise ValueError("n_swa and swa_pattern must be >= 0")
    path = Path(path)
    vocab = TinyVocab(n_vocab=n_vocab)
    rng = np.random.default_rng(seed)
    tensors = tiny_target_tensors(rng, arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                                  n_head_kv=n_head_kv, n_ff=n_ff, n_vocab=vocab.n_vocab)
    writer = gguf.GGUFWriter(str(path), arch)
    _hparams_to(writer, arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                n_ff=n_ff, n_ctx_train=n_ctx_train, n_vocab=vocab.n_vocab, n_swa=n_swa,
                swa_pattern=swa_pattern)
    _write_all(writer, vocab, tensors, chat_template)
    return path


# --------------------------------------------------------------------------------------
# The Gated DeltaNet hybrids (linear-attention layers, a full-attention layer every
# ``full_attention_interval`` layers), with the tensor layouts of llama.cpp's qwen35, qwen35moe
# and qwen3next loaders.
# --------------------------------------------------------------------------------------

def write_tiny_qwen35(path: str | Path, *, n_layer: int = 4, n_embd: int = 64, n_head: int = 4,
                      n_head_kv: int = 2, head_dim: int = 16, n_rot: int = 8, n_ff: int = 128,
                      n_ctx_train: int = 2048, full_attn_interval: int = 2, d_state: int = 16,
                      n_k_heads: int = 2, n_v_heads: int = 4, d_conv: int = 4, seed: int = 0,
                      n_vocab: int | None = None, chat_template: str = CHATML_TEMPLATE) -> Path:
    """Write a random-weight qwen35 (Gated DeltaNet hybrid) GGUF, F32, tied embeddings: the
    keyword arguments of ``tfm_local.testing.hybrid.HybridShape`` (layer il is attention when
    (il + 1) % full_attn_interval == 0; defaults: layers 0, 2 DeltaNet, 1, 3 attention, S = 16,
    H_k = 2, H_v = 4) written by ``tfm_local.testing.hybrid.write_qwen35``.

    Returns the path written; raises ValueError for an inconsistent shape (HybridShape.validate).
    """
    return write_tiny_hybrid(path, arch="qwen35", n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                             n_head_kv=n_head_kv, head_dim=head_dim, n_rot=n_rot, n_ff=n_ff,
                             n_ctx_train=n_ctx_train, full_attn_interval=full_attn_interval, d_state=d_state,
                             n_k_heads=n_k_heads, n_v_heads=n_v_heads, d_conv=d_conv, seed=seed,
                             n_vocab=n_vocab, chat_template=chat_template)


def write_tiny_hybrid(path: str | Path, *, arch: str = "qwen35", n_layer: int = 4, n_embd: int = 64,
                      n_head: int = 4, n_head_kv: int = 2, head_dim: int = 16, n_rot: int = 8, n_ff: int = 128,
                      n_ctx_train: int = 2048, full_attn_interval: int = 2, d_state: int = 16,
                      n_k_heads: int = 2, n_v_heads: int = 4, d_conv: int = 4, n_expert: int = 4,
                      n_expert_used: int = 4, n_ff_exp: int = 32, n_ff_shexp: int = 64, seed: int = 0,
                      n_vocab: int | None = None, chat_template: str = CHATML_TEMPLATE) -> Path:
    """Write a random-weight Gated DeltaNet hybrid GGUF of ``arch`` ("qwen35", "qwen35moe" or
    "qwen3next"), F32, tied embeddings: the keyword arguments of ``HybridShape`` and ``ExpertShape`` written by
    ``tfm_local.testing.hybrid.write_hybrid``. The defaults are the tiny test models: layers 0, 2
    DeltaNet, 1, 3 attention, S = 16, H_k = 2, H_v = 4; for the MoE archs 4 experts of width 32,
    all 4 used per token, and a shared expert of width 64 (qwen35 ignores the expert sizes). All
    experts are used so that the router's top-k selection, a discontinuous function, cannot flip
    between two numerically different computations (tree batch vs path decoding) on a near-tie of
    router logits: seen on CUDA with 2 of 4 (logit gaps of 0.1-1.0 at one node out of hundreds).

    Returns the path written; raises ValueError for an unknown arch or an inconsistent shape.
    """
    shape = HybridShape(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                        n_rot=n_rot, n_ff=n_ff, n_ctx_train=n_ctx_train, full_attn_interval=full_attn_interval,
                        d_state=d_state, n_k_heads=n_k_heads, n_v_heads=n_v_heads, d_conv=d_conv, n_vocab=n_vocab)
    experts = ExpertShape(n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, n_ff_shexp=n_ff_shexp)
    return write_hybrid(path, shape, arch=arch, experts=experts, dtype="f32", seed=seed, chat_template=chat_template)


# --------------------------------------------------------------------------------------
# Running the synthetic models with llama.cpp's low-level API (llama_cpp imported lazily,
# so writing GGUFs needs no llama.cpp). Pointers are the ctypes objects llama_cpp returns.
# --------------------------------------------------------------------------------------

def llama_cpp_lib():
    """Import ``llama_cpp``, silence its log (unless $TFM_VERBOSE) and init the backend once."""
    import ctypes
    import os

    import llama_cpp as lc

    if not getattr(llama_cpp_lib, "ready", False):
        if not os.environ.get("TFM_VERBOSE"):
            llama_cpp_lib.sink = lc.llama_log_callback(lambda level, text, data: None)
            lc.llama_log_set(llama_cpp_lib.sink, ctypes.c_void_p(0))
        lc.llama_backend_init()
        llama_cpp_lib.ready = True
    return lc


def load_model(path: str | Path):
    """Load a GGUF on the CPU; returns the llama_model pointer. Raises RuntimeError when refused."""
    from ..llama.model import model_params

    lc = llama_cpp_lib()
    model = lc.llama_model_load_from_file(str(path).encode(), model_params(0))
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model


def new_context(model, *, n_ctx: int = 256, n_batch: int = 64, ctx_other=None):
    """A context (n_ubatch = n_batch, 2 threads, one sequence); ``ctx_other`` shares its model's tensors."""
    lc = llama_cpp_lib()
    p = lc.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, n_batch, n_batch, 1
    p.n_threads = p.n_threads_batch = 2
    if ctx_other is not None:
        p.ctx_other = ctx_other
    ctx = lc.llama_init_from_model(model, p)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    return ctx


def tokenize(model, text: str, parse_special: bool = False) -> list[int]:
    """Token ids of ``text`` (no BOS added)."""
    lc = llama_cpp_lib()
    vocab = lc.llama_model_get_vocab(model)
    raw = text.encode("utf-8")
    buf = (lc.llama_token * (len(raw) + 8))()
    n = lc.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, parse_special)
    if n < 0:
        raise RuntimeError(f"tokenize failed ({n})")
    return list(buf[:n])


def detokenize(model, tokens: list[int]) -> str:
    """Text of ``tokens`` (special tokens rendered)."""
    import ctypes

    lc = llama_cpp_lib()
    vocab = lc.llama_model_get_vocab(model)
    arr = (lc.llama_token * max(1, len(tokens)))(*tokens)
    out = ctypes.create_string_buffer(16 * len(tokens) + 16)
    n = lc.llama_detokenize(vocab, arr, len(tokens), out, len(out), False, True)
    if n < 0:
        raise RuntimeError(f"detokenize failed ({n})")
    return out.raw[:n].decode("utf-8")


def _process(lc, ctx, batch, what: str) -> None:
    """llama_process(DECODE) and free the batch; RuntimeError on a non-zero code."""
    try:
        rc = lc.llama_process(ctx, lc.LLAMA_PROCESS_TYPE_DECODE, batch)
    finally:
        lc.llama_batch_ext_free(batch)
    if rc != 0:
        raise RuntimeError(f"decode of {what} failed (code {rc})")


def decode_tokens(ctx, tokens: list[int], pos0: int = 0) -> np.ndarray:
    """Decode ``tokens`` at positions pos0.. in sequence 0; returns logits float32 [n, n_vocab] (a copy)."""
    import ctypes

    lc = llama_cpp_lib()
    batch = lc.llama_batch_ext_init(ctx)
    pos = (ctypes.c_int32 * 4)()
    for i, t in enumerate(tokens):
        idx = lc.llama_batch_ext_add_token(batch, 0, int(t))
        if idx < 0:
            lc.llama_batch_ext_free(batch)
            raise RuntimeError(f"token {t} rejected by the batch (code {idx})")
        pos[0] = pos0 + i
        lc.llama_batch_ext_set_pos(batch, idx, pos)
        lc.llama_batch_ext_set_output_logits(batch, idx, True)
    _process(lc, ctx, batch, f"{len(tokens)} tokens")
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(lc.llama_get_model(ctx)))
    rows = [np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
            for i in range(len(tokens))]
    return np.stack(rows)


def decode_embeddings(ctx, rows: np.ndarray, pos0: int = 0) -> None:
    """Decode embedding rows float32 [n, width] at positions pos0.. in sequence 0 (no outputs).

    For a DFlash drafter this is KV injection: width = n_target_layers × target n_embd.
    """
    import ctypes

    lc = llama_cpp_lib()
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    batch = lc.llama_batch_ext_init(ctx)
    pos = (ctypes.c_int32 * 4)()
    for i in range(rows.shape[0]):
        ptr = rows[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        idx = lc.llama_batch_ext_add_embd(batch, 0, lc.llama_embd(ptr, 1, rows.shape[1]))
        if idx < 0:
            lc.llama_batch_ext_free(batch)
            raise RuntimeError(f"embedding row {i} rejected by the batch (code {idx})")
        pos[0] = pos[1] = pos[2] = pos0 + i
        lc.llama_batch_ext_set_pos(batch, idx, pos)
    _process(lc, ctx, batch, f"{rows.shape[0]} embedding rows")
