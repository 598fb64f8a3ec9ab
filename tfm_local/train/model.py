"""The DFlash drafter in PyTorch: what llama.cpp's ``dflash`` graph computes, trainable.

Method: DFlash (arXiv 2602.06036; z-lab/dflash), as run by llama.cpp
``src/models/dflash.cpp``:

* Context (KV injection): the target's layer-input features of the committed
  tokens, concatenated ``[n_ctx, n_target_layers · hidden]``, go through
  ``fc`` then RMSNorm (``hidden_norm``) to ``g``; every layer's keys are
  ``RoPE(k_norm(k_proj(g)))`` and values ``v_proj(g)`` at the context positions.
* Block (noise): ``[x_P, MASK × (B-1)]`` embedded by the target's table at
  positions ``P ..``; Qwen3 blocks (RMSNorm → q/k/v, q/k head RMSNorm, NeoX
  RoPE, attention over context keys + the block's own keys, no causal mask →
  o_proj, residual; RMSNorm → SwiGLU → residual); final RMSNorm ``norm``; the
  target's LM head gives the logits (done by the caller).

Module attribute names equal the z-lab Hugging Face names (``fc``,
``hidden_norm``, ``norm``, ``layers.N.self_attn.q_proj`` ...), so
``state_dict()`` is the checkpoint layout ``tfm_convert`` reads.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..files.dflash import DFlashConfig
from .layers import attention, rms_norm, rope


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale (init 1), epsilon from the config."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., dim]`` normalised, same dtype."""
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """Qwen3 attention whose keys/values also cover the injected context."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.c = c
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, q, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, kv, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, kv, bias=False)
        self.o_proj = nn.Linear(q, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def kv(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values ``[B, T, Hkv, D]`` of inputs ``h [B, T, hidden]`` at ``pos``."""
        B, T, _ = h.shape
        k = self.k_norm(self.k_proj(h).view(B, T, self.c.num_key_value_heads, self.c.head_dim))
        return rope(k, pos, self.c.rope_theta), self.v_proj(h).view(B, T, self.c.num_key_value_heads, self.c.head_dim)

    def forward(self, h: torch.Tensor, pos: torch.Tensor, ctx_kv: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None) -> torch.Tensor:
        """Block inputs ``h [B, Q, hidden]`` at ``pos`` attend over ``ctx_kv`` + the block → ``[B, Q, hidden]``."""
        B, T, _ = h.shape
        q = rope(self.q_norm(self.q_proj(h).view(B, T, self.c.num_attention_heads, self.c.head_dim)), pos,
                 self.c.rope_theta)
        k, v = self.kv(h, pos)
        k, v = torch.cat([ctx_kv[0], k], dim=1), torch.cat([ctx_kv[1], v], dim=1)
        return self.o_proj(attention(q, k, v, mask))


class MLP(nn.Module):
    """SwiGLU MLP (``down(silu(gate(x)) · up(x))``)."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act = F.silu if c.hidden_act == "silu" else (lambda x: F.gelu(x, approximate="tanh"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., hidden]`` → ``[..., hidden]``."""
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """One pre-norm Qwen3 decoder layer of the drafter."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, pos, ctx_kv, mask):
        """Block states ``x [B, Q, hidden]`` through one layer; ``ctx_kv``: this layer's context keys/values."""
        x = x + self.self_attn(self.input_layernorm(x), pos, ctx_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    """The DFlash drafter (no embedding or LM head: both are the target's).

    Args:
        config: a ``tfm_local.files.dflash.DFlashConfig`` (``target_layer_ids`` are
            HF ids; the features read are layer inputs ``id + 1``).
    """

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        c = config
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    @property
    def feature_layers(self) -> list[int]:
        """Layer-input indices of the target this drafter reads (HF ids + 1)."""
        return [i + 1 for i in self.config.target_layer_ids]

    def forward(self, features: torch.Tensor, ctx_pos: torch.Tensor, noise: torch.Tensor,
                noise_pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Hidden states of the block positions after the final norm.

        Args:
            features: ``[B, L, n_target_layers · hidden]`` context features.
            ctx_pos: ``[L]`` or ``[B, L]`` positions of the context.
            noise: ``[B, Q, hidden]`` embeddings of the block tokens (one or more blocks).
            noise_pos: ``[Q]`` or ``[B, Q]`` positions of the block tokens.
            mask: bool ``[B|1, 1, Q, L + Q]``, True = may attend (None = all).
        Returns:
            ``[B, Q, hidden]``; logits = the target's LM head of this.
        """
        g = self.hidden_norm(self.fc(features))
        x = noise
        for layer in self.layers:
            x = layer(x, noise_pos, layer.self_attn.kv(g, ctx_pos), mask)
        return self.norm(x)


def block_mask(anchors: torch.Tensor, ctx_len: int, block: int) -> torch.Tensor:
    """Attention mask for several blocks per sequence, trained in one forward.

    Args:
        anchors: int ``[B, A]`` anchor positions (block k starts at ``anchors[:, k]``).
        ctx_len: context length L (keys ``0 .. L-1`` are the injected features).
        block: block size.
    Returns:
        bool ``[B, 1, A·block, L + A·block]``: a query of block k sees context
        keys ``< anchors[:, k]`` and the keys of its own block, nothing else.
    """
    B, A = anchors.shape
    dev = anchors.device
    ctx = torch.arange(ctx_len, device=dev)[None, None, :] < anchors[:, :, None]  # [B, A, L]
    ctx = ctx.repeat_interleave(block, dim=1)
    own = torch.arange(A * block, device=dev) // block
    blk = (own[:, None] == own[None, :]).expand(B, -1, -1)
    return torch.cat([ctx, blk], dim=-1)[:, None]
