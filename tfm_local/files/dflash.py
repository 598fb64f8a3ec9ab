"""The DFlash drafter's format, shared by the runtime, the trainer and the converter: its config
(``DFlashConfig``, the fields of a z-lab ``config.json`` that a GGUF needs) and its tensors
(Hugging Face names, GGUF names, shapes).

A DFlash drafter (z-lab ``DFlashDraftModel``; Chen et al., "DFlash: Block Diffusion for Flash
Speculative Decoding") is a stack of Qwen3 decoder layers plus ``fc`` (projects the concatenated
target features, n_target_layers × hidden → hidden), ``hidden_norm`` (RMSNorm after fc) and
``norm`` (final RMSNorm). It has no embedding or LM head of its own: both are the target's. Names
are given without the optional ``model.`` prefix.

Shapes (``expected_shapes(config.dims)``) are in numpy / PyTorch order (out_features,
in_features); GGUF's ``ne`` is the reverse, so a tensor's bytes are written unchanged. With
q = n_heads·head_dim, kv = n_kv_heads·head_dim: per layer ``self_attn.q_proj`` [q, hidden],
``k_proj`` / ``v_proj`` [kv, hidden], ``o_proj`` [hidden, q], ``q_norm`` / ``k_norm`` [head_dim],
``mlp.gate_proj`` / ``up_proj`` [ffn, hidden], ``down_proj`` [hidden, ffn], the two layer norms
[hidden]; globally ``fc`` [hidden, n_target_layers·hidden], ``hidden_norm`` and ``norm`` [hidden].

A DFlash2 drafter (z-lab ``DFlash2DraftModel``) is a DFlash drafter with two additions (docs/design.md
§5): a dynamic short convolution around each attention and MLP sublayer, per layer
``attention_conv`` / ``mlp_conv`` with ``base_kernel`` [2 sides, K taps, hidden] (stored without
``.weight``) and ``kernel_projection.weight`` [2·K·hidden/G, hidden] (G = ``conv_group_size``), and a
path selector, ``candidate_selector.hidden_projection.weight`` [r, hidden] and the
``predecessor_codebook`` / ``successor_codebook`` [vocab, r] (stored without ``.weight``). In the
GGUF (the pinned llama.cpp's ``dflash`` architecture recognises DFlash2 by ``selector_hidden``):
``blk.N.{attn,ffn}_conv_base`` (F32, no ``.weight``), ``blk.N.{attn,ffn}_conv_proj.weight``,
``selector_hidden.weight``, ``selector_{predecessor,successor}.weight``.

Plain data, no checks and no errors of its own: validating a ``config.json`` is the converter's
(``tfm_convert.zlab.parse_config``, which raises ConvertError); ``gguf_name`` raises KeyError for a
name that is not a drafter tensor's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Target architectures a DFlash drafter can run against: those whose llama.cpp graph exposes its layer
#: inputs in our build (upstream's models plus qwen2 and gemma3, patch 0002); another target's features
#: cannot be read (llama.cpp would abort), so ``Target.set_features`` and tfm-convert refuse it.
FEATURE_ARCHS = frozenset({"llama", "qwen2", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe",
                           "gemma3", "gemma4", "lfm2", "gpt-oss", "nemotron_h", "minimax-m2"})

#: ``architectures`` entry of a DFlash drafter's ``config.json``.
ARCHITECTURE = "DFlashDraftModel"
#: ``architectures`` entry of a DFlash2 drafter's ``config.json``.
ARCHITECTURE_V2 = "DFlash2DraftModel"

#: Per-layer tensors: HF suffix after ``layers.N.`` → GGUF suffix after ``blk.N.``.
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # DFlash2: the dynamic short convolutions around the two sublayers
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}

#: Global tensors: HF name → GGUF name.
GLOBAL_NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    # DFlash2: the path selector
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
    "candidate_selector.successor_codebook": "selector_successor.weight",
}

#: Copies of the target's frozen embedding / LM head some exports carry; dropped.
SHARED_NAMES = frozenset({"embed_tokens.weight", "lm_head.weight"})


@dataclass(frozen=True)
class DrafterDims:
    """Sizes that fix every tensor shape of a DFlash drafter.

    Attributes:
        hidden: hidden size (must equal the target's n_embd).
        n_layers: decoder layers.
        n_heads, n_kv_heads, head_dim: attention geometry.
        ffn: MLP intermediate size.
        n_target_layers: number of target layers whose features are concatenated.
        conv_kernel, conv_group, selector_rank, vocab: DFlash2's convolution taps and channel group,
            the selector's rank and the vocabulary of its codebooks (all 0 for DFlash).
    """

    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    n_target_layers: int
    conv_kernel: int = 0
    conv_group: int = 0
    selector_rank: int = 0
    vocab: int = 0


def strip_prefix(name: str) -> str:
    """Drop a leading ``model.`` from a checkpoint tensor name."""
    return name[len("model."):] if name.startswith("model.") else name


def expected_shapes(d: DrafterDims) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name of a drafter with dims ``d`` → its shape (numpy order)."""
    q, kv = d.n_heads * d.head_dim, d.n_kv_heads * d.head_dim
    per_layer = {
        "input_layernorm.weight": (d.hidden,),
        "self_attn.q_proj.weight": (q, d.hidden),
        "self_attn.k_proj.weight": (kv, d.hidden),
        "self_attn.v_proj.weight": (kv, d.hidden),
        "self_attn.o_proj.weight": (d.hidden, q),
        "self_attn.q_norm.weight": (d.head_dim,),
        "self_attn.k_norm.weight": (d.head_dim,),
        "post_attention_layernorm.weight": (d.hidden,),
        "mlp.gate_proj.weight": (d.ffn, d.hidden),
        "mlp.up_proj.weight": (d.ffn, d.hidden),
        "mlp.down_proj.weight": (d.hidden, d.ffn),
    }
    shapes = {
        "fc.weight": (d.hidden, d.n_target_layers * d.hidden),
        "hidden_norm.weight": (d.hidden,),
        "norm.weight": (d.hidden,),
    }
    if d.selector_rank:  # DFlash2
        projected = 2 * d.conv_kernel * (d.hidden // d.conv_group)
        for conv in ("attention_conv", "mlp_conv"):
            per_layer[f"{conv}.base_kernel"] = (2, d.conv_kernel, d.hidden)
            per_layer[f"{conv}.kernel_projection.weight"] = (projected, d.hidden)
        shapes.update({"candidate_selector.hidden_projection.weight": (d.selector_rank, d.hidden),
                       "candidate_selector.predecessor_codebook": (d.vocab, d.selector_rank),
                       "candidate_selector.successor_codebook": (d.vocab, d.selector_rank)})
    for i in range(d.n_layers):
        shapes.update({f"layers.{i}.{k}": v for k, v in per_layer.items()})
    return shapes


def gguf_name(hf_name: str) -> str:
    """GGUF tensor name of an HF drafter tensor (prefix already stripped).

    Raises:
        KeyError: not a DFlash drafter tensor name.
    """
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"blk.{int(parts[1])}.{LAYER_NAMES[parts[2]]}"
    raise KeyError(hf_name)


def is_norm(hf_name: str) -> bool:
    """True for RMSNorm weights."""
    return hf_name.endswith("norm.weight") or hf_name.endswith("layernorm.weight")


def keeps_f32(hf_name: str) -> bool:
    """True for the tensors every output type keeps in F32: the norms and DFlash2's base kernels
    (llama.cpp adds them to the dynamic coefficients, an F32 operation)."""
    return is_norm(hf_name) or hf_name.endswith(".base_kernel")


@dataclass(frozen=True)
class DFlashConfig:
    """The fields of a DFlash ``config.json`` that the GGUF needs.

    Attributes:
        hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
        head_dim, intermediate_size: Qwen3 block geometry.
        vocab_size: vocabulary the drafter was trained with (the target's).
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base frequency.
        max_position_embeddings: context length (0 when absent).
        hidden_act: "silu" or "gelu".
        target_layer_ids: 0-based target layers whose outputs are the features.
        mask_token_id: id of the MASK token in the target vocabulary.
        block_size: tokens per drafted block (16 for DFlash).
        num_target_layers: depth of the target it was trained for (0 when absent).
        conv_kernel_size, conv_group_size, selector_rank, selector_top_k: DFlash2's convolution taps,
            channels per dynamic coefficient, selector rank and candidates per position (all 0 for
            DFlash).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    hidden_act: str
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int
    num_target_layers: int = 0
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0

    @property
    def dflash2(self) -> bool:
        """True for a DFlash2 drafter (a path selector and dynamic convolutions)."""
        return self.selector_top_k > 0

    @property
    def dims(self) -> DrafterDims:
        """Tensor-shape sizes of this drafter."""
        v2 = self.dflash2
        return DrafterDims(self.hidden_size, self.num_hidden_layers, self.num_attention_heads,
                           self.num_key_value_heads, self.head_dim, self.intermediate_size,
                           len(self.target_layer_ids), conv_kernel=self.conv_kernel_size if v2 else 0,
                           conv_group=self.conv_group_size if v2 else 0,
                           selector_rank=self.selector_rank if v2 else 0, vocab=self.vocab_size if v2 else 0)

    def to_dict(self, dtype: str = "float32") -> dict[str, Any]:
        """A z-lab style ``config.json`` dict (``dtype``: "float32", "float16" or "bfloat16")."""
        dflash = {"target_layer_ids": list(self.target_layer_ids), "mask_token_id": self.mask_token_id,
                  "block_size": self.block_size}
        if self.dflash2:
            dflash.update(conv_kernel_size=self.conv_kernel_size, conv_group_size=self.conv_group_size,
                          selector_rank=self.selector_rank, selector_top_k=self.selector_top_k)
        return {
            "architectures": [ARCHITECTURE_V2 if self.dflash2 else ARCHITECTURE], "model_type": "qwen3",
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": None, "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": self.hidden_act, "attention_bias": False, "tie_word_embeddings": False,
            "use_sliding_window": False, "initializer_range": 0.02, "torch_dtype": dtype,
            "block_size": self.block_size, "num_target_layers": self.num_target_layers,
            "dflash_config": dflash,
        }
