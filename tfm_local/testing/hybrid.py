"""Random-weight Gated DeltaNet hybrid GGUF files of any shape, written streaming: llama.cpp's
``qwen35`` (dense FFN) and its MoE relatives ``qwen35moe`` and ``qwen3next``.

Layer ``il`` is full (gated) attention when ``(il + 1) % full_attn_interval == 0``, otherwise a
Gated DeltaNet layer; tensor names, shapes and keys are those of the pinned llama.cpp loaders
(``src/models/qwen35.cpp``, ``qwen35moe.cpp``, ``qwen3next.cpp``: ``load_arch_hparams`` and
``load_arch_tensors``). The three differ only in:

- ``qwen35``: SwiGLU FFN (``ffn_gate`` / ``ffn_up`` / ``ffn_down``), IMRoPE with
  ``rope.dimension_sections``, separate ``ssm_beta`` / ``ssm_alpha`` projections;
- ``qwen35moe``: the same attention and DeltaNet tensors, the FFN replaced by routed experts
  (``ffn_gate_inp`` router, ``ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps``, softmax over
  ``expert_count``, top ``expert_used_count``, weights renormalised) plus one shared expert
  (``ffn_gate_shexp`` / ``ffn_up_shexp`` / ``ffn_down_shexp``) scaled by sigmoid(``ffn_gate_inp_shexp``·x);
- ``qwen3next``: the MoE FFN of ``qwen35moe``, NeoX RoPE (no sections), and one fused
  ``ssm_ba`` projection (per q/k head group: H_v/H_k betas then H_v/H_k alphas) instead of
  ``ssm_beta`` / ``ssm_alpha``; its graph repeats the q/k heads interleaved (k0 k0 k1 k1), where
  qwen35's broadcast is tiled (k0 k1 k0 k1).

Tensor shapes below are numpy (row-major) order, GGUF's ``ne`` reversed: ``token_embd.weight``
is ``(n_vocab, n_embd)``. Embeddings are tied (no ``output.weight``; llama.cpp duplicates
``token_embd`` for the output layer).

Weights (all from one seeded ``numpy.random.Generator``, drawn in file order, so a file is a
function of its arch, shape, dtype and seed):

- projections N(0, 1/fan_in): every sub-layer adds a residual update comparable to the embedding;
  the residual-branch outputs (``attn_output``, ``ssm_out``, ``ffn_down``, ``ffn_down_exps``,
  ``ffn_down_shexp``) are scaled by
  ``min(1, sqrt(4 / n_layer))`` so the residual stream grows like at most 4 layers' worth and the
  activations stay finite (and inside F16's range) at any depth;
- ``token_embd`` rows of norm ``logit_std`` (logits ≈ N(0, logit_std²) after the final RMSNorm);
- RMSNorm weights 1 + N(0, 0.01); DeltaNet decays e^g, g = softplus(alpha + dt) · a, mostly in
  0.4–0.95 (``ssm_a`` = −exp(U(−2, −0.5)), ``ssm_dt.bias`` N(0, 0.09)).

Memory: tensors are generated in chunks of at most ``CHUNK_ELEMENTS`` values while the file is
written (gguf's writer calls ``tofile`` on a stand-in object per tensor), so writing a
multi-GB file needs a few hundred MB. F32 files draw float64 normals (the tiny test models'
historic bytes), F16 files draw float32 normals (about 1.5× faster), then round.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

import gguf

from .vocab import CHATML_TEMPLATE, TinyVocab

ARCH = "qwen35"
ARCHS = ("qwen35", "qwen35moe", "qwen3next")
MOE_ARCHS = frozenset({"qwen35moe", "qwen3next"})
CHUNK_ELEMENTS = 1 << 24  # values generated at once (128 MiB of float64)
DTYPES = {"f32": np.float32, "f16": np.float16}
_FILE_TYPE = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}


@dataclass(frozen=True)
class HybridShape:
    """Dimensions of a qwen35 hybrid. Defaults: the 4-layer tiny test model.

    n_layer: decoder layers; full_attn_interval: every this-many-th layer is attention.
    n_embd: hidden size; n_ff: SwiGLU FFN width; n_ctx_train: trained context (a key only).
    n_head / n_head_kv / head_dim: attention query / KV heads and head size; n_rot: rotated dims
    per head (IMRoPE sections [n_rot/4, n_rot/8, n_rot/8, 0]).
    d_state: S = S_k = S_v, the DeltaNet head size; n_k_heads: H_k (q/k heads); n_v_heads: H_v
    (value / state heads, a multiple of H_k); d_conv: short-conv kernel.
    n_vocab: vocabulary size incl. padding (None: TinyVocab's default, 320).
    The expert sizes of the MoE archs are an ``ExpertShape``.
    """

    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_rot: int = 8
    n_ff: int = 128
    n_ctx_train: int = 2048
    full_attn_interval: int = 2
    d_state: int = 16
    n_k_heads: int = 2
    n_v_heads: int = 4
    d_conv: int = 4
    n_vocab: int | None = None

    @classmethod
    def qwen36_27b(cls, n_layer: int = 4, n_vocab: int | None = 248_320) -> "HybridShape":
        """Qwen3.6-27B's per-layer shapes (docs/gdn-tree.md, "What remains"): hidden 5120, 3 DeltaNet +
        1 attention per group of 4, H_v 48 / H_k 16 of 128, conv 4, attention 24 / 4 heads of 256 (64
        rotated), FFN 17,408; ``n_layer`` (the model has 64) and ``n_vocab`` (248,320) as given."""
        return cls(n_layer=n_layer, n_embd=5120, n_head=24, n_head_kv=4, head_dim=256, n_rot=64,
                   n_ff=17_408, n_ctx_train=262_144, full_attn_interval=4, d_state=128, n_k_heads=16,
                   n_v_heads=48, d_conv=4, n_vocab=n_vocab)

    def replace(self, **kw) -> "HybridShape":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **kw)

    def validate(self) -> None:
        """Raise ValueError for an inconsistent shape: H_v not a multiple of H_k, n_rot not a multiple
        of 8 or above head_dim, a non-positive size, or no layer of one of the two kinds."""
        sizes = {k: v for k, v in dataclasses.asdict(self).items() if k != "n_vocab"}
        bad = [k for k, v in sizes.items() if v < 1]
        if bad:
            raise ValueError(f"sizes must be >= 1: {bad}")
        if self.n_v_heads % self.n_k_heads:
            raise ValueError("n_v_heads must be a multiple of n_k_heads")
        if self.n_rot % 8 or self.n_rot > self.head_dim:
            raise ValueError("n_rot must be a multiple of 8 and at most head_dim")
        if {self.is_attention(i) for i in range(self.n_layer)} != {True, False}:
            raise ValueError("n_layer and full_attn_interval must give both attention and DeltaNet layers")

    def is_attention(self, il: int) -> bool:
        """True when layer ``il`` is a full-attention layer."""
        return (il + 1) % self.full_attn_interval == 0

    @property
    def conv_dim(self) -> int:
        """Short-conv channels: 2·S·H_k (q, k) + S·H_v (v)."""
        return self.d_state * (2 * self.n_k_heads + self.n_v_heads)


@dataclass(frozen=True)
class ExpertShape:
    """The FFN of the MoE archs (qwen35moe, qwen3next; qwen35 has none). Defaults: the tiny test models.

    n_expert routed experts, of which n_expert_used per token (softmax router, weights renormalised);
    n_ff_exp: a routed expert's FFN width; n_ff_shexp: the shared expert's FFN width.
    """

    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_ff_shexp: int = 64

    def validate(self) -> None:
        """Raise ValueError for a non-positive size or more experts used than there are."""
        bad = [k for k, v in dataclasses.asdict(self).items() if v < 1]
        if bad:
            raise ValueError(f"sizes must be >= 1: {bad}")
        if self.n_expert_used > self.n_expert:
            raise ValueError("n_expert_used must be at most n_expert")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: GGUF name, numpy shape, and how its values are drawn.

    kind: "mat" (N(0,1)·mul/div, evaluated left to right), "norm" (1 + 0.1·N(0,1)), "a" (−exp(U(−2, −0.5))).
    f32: kept F32 in an F16 file (1-D tensors and the conv kernel, which ggml_ssm_conv takes in F32 only).
    """

    name: str
    shape: tuple[int, ...]
    kind: str = "mat"
    mul: float = 1.0
    div: float = 1.0
    f32: bool = False

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def tensor_specs(shape: HybridShape, n_vocab: int, logit_std: float = 3.0, arch: str = ARCH,
                 experts: ExpertShape = ExpertShape()) -> list[TensorSpec]:
    """The tensors of ``shape`` (and ``experts`` for the MoE archs) for ``arch`` in file (and draw)
    order; see the module docstring for the values.

    Attention layers: ``attn_q`` (2·n_head·head_dim, n_embd) (query and output gate interleaved per
    head), ``attn_k`` / ``attn_v`` (n_head_kv·head_dim, n_embd), ``attn_output`` (n_embd,
    n_head·head_dim), ``attn_q_norm`` / ``attn_k_norm`` (head_dim). DeltaNet layers: ``attn_qkv``
    (conv_dim, n_embd), ``attn_gate`` (S·H_v, n_embd), ``ssm_conv1d`` (conv_dim, d_conv),
    ``ssm_dt.bias`` (H_v), ``ssm_a`` (H_v), ``ssm_beta`` / ``ssm_alpha`` (H_v, n_embd), ``ssm_norm``
    (S), ``ssm_out`` (n_embd, S·H_v). Every layer: ``attn_norm``, ``post_attention_norm`` (n_embd),
    ``ffn_gate`` / ``ffn_up`` (n_ff, n_embd), ``ffn_down`` (n_embd, n_ff).

    qwen3next: ``ssm_ba`` (2·H_v, n_embd) replaces ``ssm_beta`` / ``ssm_alpha``. qwen35moe and
    qwen3next: the FFN is ``ffn_gate_inp`` (n_expert, n_embd), ``ffn_gate_exps`` / ``ffn_up_exps``
    (n_expert, n_ff_exp, n_embd), ``ffn_down_exps`` (n_expert, n_embd, n_ff_exp),
    ``ffn_gate_inp_shexp`` (n_embd), ``ffn_gate_shexp`` / ``ffn_up_shexp`` (n_ff_shexp, n_embd),
    ``ffn_down_shexp`` (n_embd, n_ff_shexp); expert and shared-expert down projections get the
    residual-branch gain like ``ffn_down``.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    s, e = shape, experts
    out_gain = min(1.0, float(np.sqrt(4.0 / s.n_layer)))

    def mat(name, rows, cols, gain=1.0, f32=False):
        return TensorSpec(name, (rows, cols), "mat", gain, float(np.sqrt(cols)), f32)

    def norm(name, n):
        return TensorSpec(name, (n,), "norm")

    def exps(name, rows, cols, gain=1.0):
        return TensorSpec(name, (e.n_expert, rows, cols), "mat", gain, float(np.sqrt(cols)))

    value_dim = s.d_state * s.n_v_heads
    specs = [TensorSpec("token_embd.weight", (n_vocab, s.n_embd), "mat", logit_std, float(np.sqrt(s.n_embd))),
             norm("output_norm.weight", s.n_embd)]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        specs += [norm(p + "attn_norm.weight", s.n_embd), norm(p + "post_attention_norm.weight", s.n_embd)]
        if s.is_attention(i):
            specs += [mat(p + "attn_q.weight", 2 * s.n_head * s.head_dim, s.n_embd),
                      mat(p + "attn_k.weight", s.n_head_kv * s.head_dim, s.n_embd),
                      mat(p + "attn_v.weight", s.n_head_kv * s.head_dim, s.n_embd),
                      mat(p + "attn_output.weight", s.n_embd, s.n_head * s.head_dim, out_gain),
                      norm(p + "attn_q_norm.weight", s.head_dim), norm(p + "attn_k_norm.weight", s.head_dim)]
        else:
            specs += [mat(p + "attn_qkv.weight", s.conv_dim, s.n_embd),
                      mat(p + "attn_gate.weight", value_dim, s.n_embd),
                      mat(p + "ssm_conv1d.weight", s.conv_dim, s.d_conv, f32=True),
                      TensorSpec(p + "ssm_dt.bias", (s.n_v_heads,), "mat", 0.3),
                      TensorSpec(p + "ssm_a", (s.n_v_heads,), "a")]
            if arch == "qwen3next":
                specs += [mat(p + "ssm_ba.weight", 2 * s.n_v_heads, s.n_embd)]
            else:
                specs += [mat(p + "ssm_beta.weight", s.n_v_heads, s.n_embd),
                          mat(p + "ssm_alpha.weight", s.n_v_heads, s.n_embd)]
            specs += [norm(p + "ssm_norm.weight", s.d_state),
                      mat(p + "ssm_out.weight", s.n_embd, value_dim, out_gain)]
        if arch in MOE_ARCHS:
            specs += [mat(p + "ffn_gate_inp.weight", e.n_expert, s.n_embd),
                      exps(p + "ffn_gate_exps.weight", e.n_ff_exp, s.n_embd),
                      exps(p + "ffn_up_exps.weight", e.n_ff_exp, s.n_embd),
                      exps(p + "ffn_down_exps.weight", s.n_embd, e.n_ff_exp, out_gain),
                      TensorSpec(p + "ffn_gate_inp_shexp.weight", (s.n_embd,), "mat", 1.0, float(np.sqrt(s.n_embd))),
                      mat(p + "ffn_gate_shexp.weight", e.n_ff_shexp, s.n_embd),
                      mat(p + "ffn_up_shexp.weight", e.n_ff_shexp, s.n_embd),
                      mat(p + "ffn_down_shexp.weight", s.n_embd, e.n_ff_shexp, out_gain)]
        else:
            specs += [mat(p + "ffn_gate.weight", s.n_ff, s.n_embd), mat(p + "ffn_up.weight", s.n_ff, s.n_embd),
                      mat(p + "ffn_down.weight", s.n_embd, s.n_ff, out_gain)]
    return specs


def _chunks(spec: TensorSpec, rng: np.random.Generator, dtype, draw_dtype) -> Iterator[np.ndarray]:
    """The values of ``spec`` as flat ``dtype`` arrays of at most CHUNK_ELEMENTS, in row-major order."""
    n = spec.size
    for i0 in range(0, n, CHUNK_ELEMENTS):
        m = min(CHUNK_ELEMENTS, n - i0)
        if spec.kind == "a":
            x = -np.exp(rng.uniform(-2.0, -0.5, m))
        elif spec.kind == "norm":
            x = 1.0 + 0.1 * rng.standard_normal(m, dtype=draw_dtype)
        else:
            x = rng.standard_normal(m, dtype=draw_dtype) * spec.mul / spec.div
        yield x.astype(dtype)


class _Streamed:
    """What gguf's writer needs of a tensor (``nbytes``, ``tofile``), generating it on the fly."""

    def __init__(self, chunks: Callable[[], Iterator[np.ndarray]], nbytes: int):
        self._chunks, self.nbytes = chunks, nbytes

    def tofile(self, fout) -> None:
        n = 0
        for c in self._chunks():
            c.tofile(fout)
            n += c.nbytes
        assert n == self.nbytes, (n, self.nbytes)


def _hparams_to(w: gguf.GGUFWriter, s: HybridShape, dtype: str, arch: str = ARCH,
                e: ExpertShape = ExpertShape()) -> None:
    """The ``{arch}.*`` keys (and name, file type) of ``s`` (and ``e`` for the MoE archs)."""
    w.add_name(f"tfm-tiny-{arch}")
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(_FILE_TYPE[dtype])
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.n_rot)
    if arch != "qwen3next":  # IMRoPE (qwen3next: NeoX over n_rot dims, no sections)
        w.add_array(f"{arch}.rope.dimension_sections", [s.n_rot // 4, s.n_rot // 8, s.n_rot // 8, 0])
    w.add_uint32(f"{arch}.full_attention_interval", s.full_attn_interval)
    w.add_uint32(f"{arch}.ssm.conv_kernel", s.d_conv)
    w.add_uint32(f"{arch}.ssm.inner_size", s.d_state * s.n_v_heads)
    w.add_uint32(f"{arch}.ssm.state_size", s.d_state)
    w.add_uint32(f"{arch}.ssm.time_step_rank", s.n_v_heads)
    w.add_uint32(f"{arch}.ssm.group_count", s.n_k_heads)
    if arch in MOE_ARCHS:
        w.add_expert_count(e.n_expert)
        w.add_expert_used_count(e.n_expert_used)
        w.add_expert_feed_forward_length(e.n_ff_exp)
        w.add_expert_shared_feed_forward_length(e.n_ff_shexp)


def file_bytes(shape: HybridShape, dtype: str = "f16", arch: str = ARCH,
               experts: ExpertShape = ExpertShape()) -> int:
    """Approximate size of the file in bytes (tensor data; 1-D tensors are always F32)."""
    n_vocab = shape.n_vocab or TinyVocab().n_vocab
    item = np.dtype(DTYPES[dtype]).itemsize
    specs = tensor_specs(shape, n_vocab, arch=arch, experts=experts)
    return sum(t.size * (4 if t.f32 or len(t.shape) < 2 else item) for t in specs)


def write_qwen35(path: str | Path, shape: HybridShape = HybridShape(), *, dtype: str = "f32", seed: int = 0,
                 chat_template: str = CHATML_TEMPLATE) -> Path:
    """Write a random-weight qwen35 GGUF of ``shape`` that llama.cpp loads and runs
    (``write_hybrid`` with ``arch="qwen35"``)."""
    return write_hybrid(path, shape, arch="qwen35", dtype=dtype, seed=seed, chat_template=chat_template)


def write_hybrid(path: str | Path, shape: HybridShape = HybridShape(), *, arch: str = ARCH,
                 experts: ExpertShape = ExpertShape(), dtype: str = "f32", seed: int = 0,
                 chat_template: str = CHATML_TEMPLATE) -> Path:
    """Write a random-weight GGUF of ``arch`` ("qwen35", "qwen35moe" or "qwen3next") and ``shape``
    that llama.cpp loads and runs.

    Args:
        path: output file (overwritten).
        shape: the dimensions (``HybridShape``; ``HybridShape.qwen36_27b(n_layer, n_vocab)`` for the
            Qwen3.6-27B per-layer shapes).
        arch: the llama.cpp architecture (module docstring).
        experts: the expert sizes of the MoE archs (qwen35 ignores them).
        dtype: "f32" or "f16" for the 2-D weights (1-D tensors and ``ssm_conv1d`` stay F32, as
            ggml's ssm_conv needs).
        seed: RNG seed; equal arguments give a byte-identical file.
        chat_template: the Jinja chat template stored (default ChatML).

    Returns:
        the path written, as a Path.

    Raises:
        ValueError: unknown arch or dtype, or an inconsistent shape (``HybridShape.validate``,
            ``ExpertShape.validate``).
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    shape.validate()
    experts.validate()
    path = Path(path)
    vocab = TinyVocab(n_vocab=shape.n_vocab)
    rng = np.random.default_rng(seed)
    draw = np.float64 if dtype == "f32" else np.float32
    w = gguf.GGUFWriter(str(path), arch)
    _hparams_to(w, shape, dtype, arch, experts)
    vocab.write_to(w, chat_template)
    for spec in tensor_specs(shape, vocab.n_vocab, arch=arch, experts=experts):
        out = np.dtype(np.float32 if spec.f32 or len(spec.shape) < 2 else DTYPES[dtype])
        w.add_tensor_info(spec.name, spec.shape, out, spec.size * out.itemsize)
        # the writer writes ti.tensor.tofile(fout) in insertion order: generate then, in that order
        w.tensors[-1][spec.name].tensor = _Streamed(
            lambda spec=spec, out=out: _chunks(spec, rng, out, draw), spec.size * out.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
