"""The DFlash drafter's tensors: Hugging Face names, GGUF names and shapes.

A DFlash drafter (z-lab ``DFlashDraftModel``) is a stack of Qwen3 decoder
layers plus ``fc`` (projects the concatenated target features,
n_target_layers × hidden → hidden), ``hidden_norm`` (RMSNorm after fc) and
``norm`` (final RMSNorm). It has no embedding or LM head of its own: both
are the target's. Names are given without the optional ``model.`` prefix.

Shapes are in numpy / PyTorch order (out_features, in_features); GGUF's
``ne`` is the reverse, so a tensor's bytes are written unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

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
