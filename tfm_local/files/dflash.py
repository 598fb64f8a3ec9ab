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

Plain data, no checks and no errors of its own: validating a ``config.json`` is the converter's
(``tfm_convert.zlab.parse_config``, which raises ConvertError); ``gguf_name`` raises KeyError for a
name that is not a drafter tensor's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: ``architectures`` entry of a DFlash drafter's ``config.json``.
ARCHITECTURE = "DFlashDraftModel"

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
}

#: Global tensors: HF name → GGUF name.
GLOBAL_NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
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
    """

    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    n_target_layers: int


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
    """True for RMSNorm weights (kept F32 in every output type)."""
    return hf_name.endswith("norm.weight") or hf_name.endswith("layernorm.weight")


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

    @property
    def dims(self) -> DrafterDims:
        """Tensor-shape sizes of this drafter."""
        return DrafterDims(self.hidden_size, self.num_hidden_layers, self.num_attention_heads,
                           self.num_key_value_heads, self.head_dim, self.intermediate_size,
                           len(self.target_layer_ids))

    def to_dict(self, dtype: str = "float32") -> dict[str, Any]:
        """A z-lab style ``config.json`` dict (``dtype``: "float32", "float16" or "bfloat16")."""
        return {
            "architectures": [ARCHITECTURE], "model_type": "qwen3",
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": None, "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": self.hidden_act, "attention_bias": False, "tie_word_embeddings": False,
            "use_sliding_window": False, "initializer_range": 0.02, "torch_dtype": dtype,
            "block_size": self.block_size, "num_target_layers": self.num_target_layers,
            "dflash_config": {"target_layer_ids": list(self.target_layer_ids),
                              "mask_token_id": self.mask_token_id, "block_size": self.block_size},
        }
