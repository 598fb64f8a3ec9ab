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

DFlash2 (``config.dflash2``; z-lab DFlash2, docs/design.md §5, as the pinned graph computes it):

* a dynamic short convolution before and after each sublayer (``attention_conv``,
  ``mlp_conv``): coefficients ``kernel_projection(x̂)`` ``[2 sides, K taps, G groups]`` from the
  sublayer's normalised input x̂, added to ``base_kernel`` ``[2, K, hidden]`` (a group's coefficient
  shared by its channels); side s maps y to Σ_o w[s, o] · y[t − o], zero-padded at the block's start
  (no tap crosses it); side 0 acts on x̂, side 1 on the sublayer's output before the residual add;
* the path selector (``candidate_selector``): for a position's candidates s and a predecessor p,
  score(p → s) = the drafter's logit of s + Σ_r pred[p]_r · (W h)_r · succ[s]_r, h the position's
  final hidden state (``CandidateSelector.scores``).

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


class DynamicConv(nn.Module):
    """DFlash2's dynamic short convolution around one sublayer (see the module doc).

    Initialised as the identity (1 on tap 0 of the base kernel, a zero projection): a fresh DFlash2
    layer computes what its DFlash layer does.
    """

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.taps, self.groups = c.conv_kernel_size, c.hidden_size // c.conv_group_size
        base = torch.zeros(2, self.taps, c.hidden_size)
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(c.hidden_size, 2 * self.taps * self.groups, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def weights(self, xn: torch.Tensor) -> torch.Tensor:
        """Per-token kernels ``[B, Q, 2, K, hidden]`` from the sublayer's normalised input ``xn [B, Q, hidden]``."""
        B, Q, H = xn.shape
        dyn = self.kernel_projection(xn).view(B, Q, 2, self.taps, self.groups)
        return self.base_kernel + dyn.repeat_interleave(H // self.groups, dim=-1)

    def conv(self, y: torch.Tensor, w: torch.Tensor, side: int, block: int) -> torch.Tensor:
        """Side ``side`` of the convolution on ``y [B, Q, hidden]`` (Q = blocks × ``block``) with ``w``
        from ``weights``; taps do not cross a block's start."""
        B, Q, H = y.shape
        yb = y.view(B, Q // block, block, H)
        wb = w[:, :, side].view(B, Q // block, block, self.taps, H)
        out = yb * wb[:, :, :, 0]
        for o in range(1, min(self.taps, block)):
            out = out + F.pad(yb[:, :, :block - o], (0, 0, o, 0)) * wb[:, :, :, o]
        return out.view(B, Q, H)


class Layer(nn.Module):
    """One pre-norm Qwen3 decoder layer of the drafter (with DFlash2's convolutions when configured)."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)
        if c.dflash2:
            self.attention_conv = DynamicConv(c)
            self.mlp_conv = DynamicConv(c)

    def forward(self, x, pos, ctx_kv, mask, block: int):
        """Block states ``x [B, Q, hidden]`` through one layer; ``ctx_kv``: this layer's context keys/values;
        ``block``: tokens per block (DFlash2's convolutions stop at each block's start)."""
        if not hasattr(self, "attention_conv"):
            x = x + self.self_attn(self.input_layernorm(x), pos, ctx_kv, mask)
            return x + self.mlp(self.post_attention_layernorm(x))
        xn = self.input_layernorm(x)
        w = self.attention_conv.weights(xn)
        a = self.self_attn(self.attention_conv.conv(xn, w, 0, block), pos, ctx_kv, mask)
        x = x + self.attention_conv.conv(a, w, 1, block)
        xn = self.post_attention_layernorm(x)
        w = self.mlp_conv.weights(xn)
        m = self.mlp(self.mlp_conv.conv(xn, w, 0, block))
        return x + self.mlp_conv.conv(m, w, 1, block)


class CandidateSelector(nn.Module):
    """DFlash2's path selector: codebooks ``[vocab, r]`` of predecessors and successors and a gate
    ``W`` ``[r, hidden]`` from a position's final hidden state. Initialised with zero successor codes
    (every score is the candidate's own logit: the greedy walk is the drafter's top-1 chain)."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.hidden_projection = nn.Linear(c.hidden_size, c.selector_rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.randn(c.vocab_size, c.selector_rank) / c.selector_rank ** 0.5)
        self.successor_codebook = nn.Parameter(torch.zeros(c.vocab_size, c.selector_rank))

    def scores(self, h: torch.Tensor, unary: torch.Tensor, prev: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """score(p → s) for every predecessor p and candidate s of each position.

        Args:
            h: ``[..., hidden]`` final hidden states of the positions.
            unary: ``[..., K]`` the drafter's logits of the candidates.
            prev: int ``[..., P]`` predecessor token ids. cand: int ``[..., K]`` candidate token ids.
        Returns:
            ``[..., P, K]``.
        """
        gate = self.hidden_projection(h)[..., None, :]  # [..., 1, r]
        pair = (self.predecessor_codebook[prev] * gate) @ self.successor_codebook[cand].transpose(-1, -2)
        return pair + unary[..., None, :]


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
        if c.dflash2:
            self.candidate_selector = CandidateSelector(c)

    @property
    def feature_layers(self) -> list[int]:
        """Layer-input indices of the target this drafter reads (HF ids + 1)."""
        return [i + 1 for i in self.config.target_layer_ids]

    def forward(self, features: torch.Tensor, ctx_pos: torch.Tensor, noise: torch.Tensor,
                noise_pos: torch.Tensor, mask: torch.Tensor | None, block: int | None = None) -> torch.Tensor:
        """Hidden states of the block positions after the final norm.

        Args:
            features: ``[B, L, n_target_layers · hidden]`` context features.
            ctx_pos: ``[L]`` or ``[B, L]`` positions of the context.
            noise: ``[B, Q, hidden]`` embeddings of the block tokens (one or more blocks).
            noise_pos: ``[Q]`` or ``[B, Q]`` positions of the block tokens.
            mask: bool ``[B|1, 1, Q, L + Q]``, True = may attend (None = all).
            block: tokens per block, Q a multiple of it (DFlash2's convolutions; default: the
                config's block size, or Q when Q is shorter).
        Returns:
            ``[B, Q, hidden]``; logits = the target's LM head of this.
        """
        g = self.hidden_norm(self.fc(features))
        x = noise
        block = block or min(self.config.block_size, noise.shape[1])
        for layer in self.layers:
            x = layer(x, noise_pos, layer.self_attn.kv(g, ctx_pos), mask, block)
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
