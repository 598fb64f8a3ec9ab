"""Building blocks shared by the PyTorch target and drafter: RMSNorm, RoPE, attention.

They compute what llama.cpp's ggml graph computes (``ggml_rms_norm`` then a
weight multiply; ``ggml_rope_ext`` in NeoX or normal mode with base θ and no
scaling; softmax attention scaled by 1/√head_dim, grouped-query heads).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32, returned in ``x``'s dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float, neox: bool = True) -> torch.Tensor:
    """Rotary position embedding.

    Args:
        x: ``[B, T, H, D]`` (D even).
        pos: integer positions ``[B, T]`` or ``[T]``.
        theta: frequency base; pair i rotates by ``pos · theta^(-2i/D)``.
        neox: rotate the halves ``(x_i, x_{i+D/2})`` (NeoX, Qwen) or adjacent
            pairs ``(x_{2i}, x_{2i+1})`` (llama.cpp "normal" mode, llama GGUFs).
    Returns:
        the rotated tensor, ``x``'s shape and dtype (computed in float32).
    """
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    p = pos.to(torch.float32)
    if p.dim() == 1:
        p = p.unsqueeze(0)
    ang = (p[..., None] * inv)[:, :, None, :]  # [B|1, T, 1, D/2]
    cos, sin = ang.cos(), ang.sin()
    xf = x.float()
    if neox:
        a, b = xf[..., : d // 2], xf[..., d // 2:]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return out.to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              causal: bool = False) -> torch.Tensor:
    """Softmax attention with grouped-query heads.

    Args:
        q: ``[B, Tq, H, D]``; k, v: ``[B, Tk, Hkv, D]`` with H a multiple of Hkv.
        mask: bool ``[B|1, 1, Tq, Tk]`` (shared by the heads), True = may attend; or None.
        causal: apply a causal mask instead (Tq == Tk, mask must be None).
    Returns:
        ``[B, Tq, H·D]`` in q's dtype. Query head h uses KV head ``h // (H / Hkv)``
        (as llama.cpp); with a mask, the heads sharing a KV head are folded into
        the query rows instead of copying K/V.
    """
    B, Tq, H, D = q.shape
    Hkv = k.shape[2]
    rep = H // Hkv
    kh, vh = k.transpose(1, 2), v.transpose(1, 2)
    if mask is None or rep == 1:
        qh = q.transpose(1, 2)
        if rep > 1:
            kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal and mask is None)
        return out.transpose(1, 2).flatten(2)
    # grouped: the rep query heads of one KV head become rep × Tq query rows (no K/V copies)
    if mask.shape[1] != 1:
        raise ValueError("attention masks must be shared by the heads ([B, 1, Tq, Tk])")
    qg = q.view(B, Tq, Hkv, rep, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, rep * Tq, D)
    out = F.scaled_dot_product_attention(qg, kh, vh, attn_mask=mask.repeat(1, 1, rep, 1))
    return out.view(B, Hkv, rep, Tq, D).permute(0, 3, 1, 2, 4).reshape(B, Tq, H * D)
