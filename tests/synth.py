"""Tiny synthetic GGUF models for fast unit tests.

``write_tiny_target`` writes a random-weight decoder (arch ``qwen2``,
``llama`` or ``gemma3``, the last with a few-token sliding window on some
layers; or the Gated-DeltaNet hybrid ``qwen35``, see ``write_tiny_qwen35``) that llama.cpp loads and runs in milliseconds, with a small
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

import re
from collections import Counter
from pathlib import Path

import numpy as np

import gguf

#: Text the merges are learned from (our own words; any short English text works).
_MERGE_CORPUS = (
    "hello world. hello there, world! the quick brown fox jumps over the lazy dog. "
    "the world says hello to the fox and the dog. a small model for a small test: "
    "hello, hello, world, world. tests sample tokens from the model and the drafter. "
    "<think> the answer is in the world of the model </think> def hello(): return 42\n"
)

#: Special tokens, in id order, appended after the learned tokens.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: ChatML template (Jinja) in the style of Qwen2.5 instruct models.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TOKEN_NORMAL = int(gguf.TokenType.NORMAL)
_TOKEN_CONTROL = int(gguf.TokenType.CONTROL)
_TOKEN_UNUSED = int(gguf.TokenType.UNUSED)

_SUPPORTED_ARCHS = ("qwen2", "llama", "gemma3", "qwen35")

#: gemma3 scales the input embedding by sqrt(n_embd) and RMS-normalises every sub-layer output
#: (post-attention / post-FFN norms), so with unit norm weights the tied embedding of the current
#: token dominates the residual and the model mostly predicts that same token again. Post-norm
#: weights of about this size let the layers dominate, like the other synthetic archs.
GEMMA3_POST_NORM_GAIN = 8.0


def byte_to_unicode() -> dict[int, str]:
    """The reversible byte → printable-character map of byte-level BPE.

    Printable Latin-1 bytes map to themselves; the other 68 bytes (controls,
    space, etc.) map, in byte order, to the code points 256, 257, ... This is
    the convention llama.cpp's BPE tokenizer (``unicode_byte_to_utf8``)
    expects for the text of byte tokens (GPT-2 scheme, Radford et al. 2019).

    Returns:
        dict of 256 entries, byte value (0..255) → one-character str.
    """
    printable = set(range(ord("!"), ord("~") + 1))
    printable |= set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _pretokenize(text: str) -> list[str]:
    """Split text into words (a leading space kept), roughly like GPT-2's pre-tokenizer."""
    return re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", text)


def learn_merges(text: str, n_merges: int) -> list[tuple[str, str]]:
    """Learn byte-level BPE merges from ``text`` (Sennrich et al. 2016).

    Greedy: repeatedly merge the most frequent adjacent pair inside words;
    ties are broken by the pair's text so the result is deterministic.

    Args:
        text: training text (UTF-8 encodable).
        n_merges: wanted number of merges; fewer are returned when no pair
            occurs twice or more.

    Returns:
        list of (left, right) symbol pairs in the byte-to-unicode alphabet,
        in merge-rank order.
    """
    b2u = byte_to_unicode()
    words = Counter(tuple(b2u[b] for b in w.encode("utf-8")) for w in _pretokenize(text))
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        words = Counter({_apply_merge(w, best): c for w, c in words.items()})
    return merges


def _apply_merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    """Replace every occurrence of ``pair`` in ``word`` by the joined symbol."""
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


class TinyVocab:
    """The synthetic tokenizer: tokens, token types and merges.

    Attributes:
        tokens: list[str] of length n_vocab; ids 0..255 are the byte tokens.
        token_types: list[int] (gguf.TokenType values) of length n_vocab.
        merges: list[str], "left right" in rank order.
        special: dict name → id for the SPECIAL_TOKENS.
        unused_ids: list[int] of the UNUSED padding ids (at the end).
    """

    def __init__(self, n_merges: int = 48, n_vocab: int | None = None):
        """Build the vocabulary.

        Args:
            n_merges: merges learned from the built-in text (≤ ~60 possible).
            n_vocab: total size; default = the used size rounded up to a
                multiple of 64 with at least 8 unused ids. Raises ValueError
                when smaller than the used size + 1.
        """
        b2u = byte_to_unicode()
        pairs = learn_merges(_MERGE_CORPUS, n_merges)
        self.tokens = [b2u[b] for b in range(256)]
        for a, b in pairs:  # two merges can spell the same token: keep one entry
            if a + b not in self.tokens:
                self.tokens.append(a + b)
        self.token_types = [_TOKEN_NORMAL] * len(self.tokens)
        self.merges = [f"{a} {b}" for a, b in pairs]
        self.special = {}
        for text in SPECIAL_TOKENS:
            self.special[text] = len(self.tokens)
            self.tokens.append(text)
            self.token_types.append(_TOKEN_CONTROL)
        n_used = len(self.tokens)
        if n_vocab is None:
            n_vocab = -(-(n_used + 8) // 64) * 64
        if n_vocab <= n_used:
            raise ValueError(f"n_vocab={n_vocab} must exceed the {n_used} used tokens")
        self.unused_ids = list(range(n_used, n_vocab))
        self.tokens += [f"[PAD{i}]" for i in self.unused_ids]
        self.token_types += [_TOKEN_UNUSED] * len(self.unused_ids)

    @property
    def n_vocab(self) -> int:
        """Number of tokens, padding included."""
        return len(self.tokens)

    def write_to(self, writer: gguf.GGUFWriter, chat_template: str = CHATML_TEMPLATE) -> None:
        """Add the tokenizer.* keys (gpt2 model, qwen2 pre-tokenizer, ``chat_template``) to ``writer``."""
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.token_types)
        writer.add_token_merges(self.merges)
        writer.add_bos_token_id(self.special["<|endoftext|>"])
        writer.add_eos_token_id(self.special["<|im_end|>"])
        writer.add_pad_token_id(self.special["<|endoftext|>"])
        writer.add_add_bos_token(False)
        writer.add_chat_template(chat_template)


def _common_hparams_to(writer: gguf.GGUFWriter, arch: str, *, n_layer: int, n_embd: int, n_head: int,
                       n_head_kv: int, n_ff: int, n_ctx_train: int, rope_base: float) -> None:
    """The keys every tiny decoder has: name, sizes, head counts, rope base, RMS eps, F32 file type."""
    writer.add_name(f"tfm-tiny-{arch}")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)


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
            or "qwen35" (``write_tiny_qwen35`` with its default recurrent sizes).
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
    if arch == "qwen35":
        return write_tiny_qwen35(path, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                                 n_ff=n_ff, n_ctx_train=n_ctx_train, seed=seed, n_vocab=n_vocab,
                                 chat_template=chat_template)
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
# qwen35: the Gated DeltaNet hybrid (linear-attention layers, a full-attention layer every
# ``full_attention_interval`` layers), with the tensor layout of llama.cpp's qwen35 loader.
# --------------------------------------------------------------------------------------

def tiny_qwen35_tensors(rng: np.random.Generator, *, n_layer: int, n_embd: int, n_head: int,
                        n_head_kv: int, head_dim: int, n_ff: int, n_vocab: int, full_attn_interval: int,
                        d_state: int, n_k_heads: int, n_v_heads: int, d_conv: int,
                        logit_std: float = 3.0) -> dict[str, np.ndarray]:
    """Random qwen35 weights, float32, numpy shape order (GGUF ``ne`` reversed).

    Layer ``il`` is full attention when ``(il + 1) % full_attn_interval == 0``,
    otherwise a Gated DeltaNet layer with S = ``d_state`` (key and value head
    size), H_k = ``n_k_heads``, H_v = ``n_v_heads``:

    - attention: ``attn_q`` (2·n_head·head_dim, n_embd) (query and output gate
      interleaved per head), ``attn_k`` / ``attn_v`` (n_head_kv·head_dim, n_embd),
      ``attn_output`` (n_embd, n_head·head_dim), ``attn_q_norm`` / ``attn_k_norm`` (head_dim);
    - DeltaNet: ``attn_qkv`` (2·S·H_k + S·H_v, n_embd), ``attn_gate`` (S·H_v, n_embd),
      ``ssm_conv1d`` (2·S·H_k + S·H_v, d_conv), ``ssm_dt.bias`` (H_v), ``ssm_a`` (H_v, negative:
      −exp(A_log)), ``ssm_beta`` / ``ssm_alpha`` (H_v, n_embd), ``ssm_norm`` (S),
      ``ssm_out`` (n_embd, S·H_v);
    - every layer: ``attn_norm``, ``post_attention_norm`` (n_embd), SwiGLU FFN.

    The decay e^g per step, g = softplus(alpha + dt) · a, lies mostly in 0.4–0.95 so
    the recurrent state carries several tokens of history.
    """
    mat, norm, t = _random_weights(rng, n_vocab=n_vocab, n_embd=n_embd, logit_std=logit_std)
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    conv_dim = 2 * key_dim + value_dim
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(n_embd)
        t[p + "post_attention_norm.weight"] = norm(n_embd)
        if (i + 1) % full_attn_interval == 0:
            t[p + "attn_q.weight"] = mat(2 * n_head * head_dim, n_embd)
            t[p + "attn_k.weight"] = mat(n_head_kv * head_dim, n_embd)
            t[p + "attn_v.weight"] = mat(n_head_kv * head_dim, n_embd)
            t[p + "attn_output.weight"] = mat(n_embd, n_head * head_dim)
            t[p + "attn_q_norm.weight"] = norm(head_dim)
            t[p + "attn_k_norm.weight"] = norm(head_dim)
        else:
            t[p + "attn_qkv.weight"] = mat(conv_dim, n_embd)
            t[p + "attn_gate.weight"] = mat(value_dim, n_embd)
            t[p + "ssm_conv1d.weight"] = (rng.standard_normal((conv_dim, d_conv)) / np.sqrt(d_conv)).astype(np.float32)
            t[p + "ssm_dt.bias"] = (0.3 * rng.standard_normal(n_v_heads)).astype(np.float32)
            t[p + "ssm_a"] = (-np.exp(rng.uniform(-2.0, -0.5, n_v_heads))).astype(np.float32)
            t[p + "ssm_beta.weight"] = mat(n_v_heads, n_embd)
            t[p + "ssm_alpha.weight"] = mat(n_v_heads, n_embd)
            t[p + "ssm_norm.weight"] = norm(d_state)
            t[p + "ssm_out.weight"] = mat(n_embd, value_dim)
        t[p + "ffn_gate.weight"] = mat(n_ff, n_embd)
        t[p + "ffn_up.weight"] = mat(n_ff, n_embd)
        t[p + "ffn_down.weight"] = mat(n_embd, n_ff)
    return t


def write_tiny_qwen35(path: str | Path, *, n_layer: int = 4, n_embd: int = 64, n_head: int = 4,
                      n_head_kv: int = 2, head_dim: int = 16, n_rot: int = 8, n_ff: int = 128,
                      n_ctx_train: int = 2048, full_attn_interval: int = 2, d_state: int = 16,
                      n_k_heads: int = 2, n_v_heads: int = 4, d_conv: int = 4, seed: int = 0,
                      n_vocab: int | None = None, chat_template: str = CHATML_TEMPLATE) -> Path:
    """Write a random-weight qwen35 (Gated DeltaNet hybrid) GGUF that llama.cpp loads and runs.

    Args:
        path: output file (overwritten).
        n_layer: decoder layers; layer il is full attention when
            (il + 1) % full_attn_interval == 0, Gated DeltaNet otherwise
            (defaults: layers 0, 2 DeltaNet, 1, 3 attention).
        n_embd, n_ff, n_ctx_train: model sizes.
        n_head, n_head_kv, head_dim, n_rot: attention layers (IMRoPE over the
            first n_rot dims of each head, sections [n_rot/4, n_rot/8, n_rot/8, 0]).
        d_state: S, the key and value head size of the DeltaNet layers.
        n_k_heads, n_v_heads: H_k (q/k heads) and H_v (v heads, the state's
            heads); H_v must be a multiple of H_k (H_v > H_k broadcasts q/k).
        d_conv: kernel of the short causal conv on q/k/v.
        seed, n_vocab, chat_template: as in ``write_tiny_target``.

    Returns:
        the path written, as a Path. F32 tensors, tied embeddings.

    Raises:
        ValueError: H_v not a multiple of H_k, n_rot not a multiple of 8 or
            above head_dim, or no layer of one of the two kinds.
    """
    if n_v_heads % n_k_heads:
        raise ValueError("n_v_heads must be a multiple of n_k_heads")
    if n_rot % 8 or n_rot > head_dim:
        raise ValueError("n_rot must be a multiple of 8 and at most head_dim")
    kinds = {(i + 1) % full_attn_interval == 0 for i in range(n_layer)}
    if kinds != {True, False}:
        raise ValueError("n_layer and full_attn_interval must give both attention and DeltaNet layers")
    path = Path(path)
    arch = "qwen35"
    vocab = TinyVocab(n_vocab=n_vocab)
    rng = np.random.default_rng(seed)
    tensors = tiny_qwen35_tensors(rng, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                                  head_dim=head_dim, n_ff=n_ff, n_vocab=vocab.n_vocab,
                                  full_attn_interval=full_attn_interval, d_state=d_state,
                                  n_k_heads=n_k_heads, n_v_heads=n_v_heads, d_conv=d_conv)
    writer = gguf.GGUFWriter(str(path), arch)
    _common_hparams_to(writer, arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                       n_ff=n_ff, n_ctx_train=n_ctx_train, rope_base=1_000_000.0)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(n_rot)
    writer.add_array(f"{arch}.rope.dimension_sections", [n_rot // 4, n_rot // 8, n_rot // 8, 0])
    writer.add_uint32(f"{arch}.full_attention_interval", full_attn_interval)
    writer.add_uint32(f"{arch}.ssm.conv_kernel", d_conv)
    writer.add_uint32(f"{arch}.ssm.inner_size", d_state * n_v_heads)
    writer.add_uint32(f"{arch}.ssm.state_size", d_state)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", n_v_heads)
    writer.add_uint32(f"{arch}.ssm.group_count", n_k_heads)
    _write_all(writer, vocab, tensors, chat_template)
    return path


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
    lc = llama_cpp_lib()
    params = lc.llama_model_default_params()
    params.n_gpu_layers = 0
    model = lc.llama_model_load_from_file(str(path).encode(), params)
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
