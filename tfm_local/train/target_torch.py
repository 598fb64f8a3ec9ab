"""The target model in PyTorch, from its GGUF: layer-input features, embedding, LM head.

Our own Qwen2 / Qwen3 / Llama forward over weights dequantized with the
``gguf`` package (``gguf_weights``), frozen. It computes what llama.cpp's
graph computes for these architectures: pre-norm blocks (RMSNorm →
attention with q/k/v biases (qwen2) or q/k head norms (qwen3), RoPE → residual;
RMSNorm → SwiGLU MLP → residual), final RMSNorm, LM head (``output.weight``,
or the embedding when tied).

Feature semantics (as llama.cpp's ``Target.features``): the feature of layer
index ``il`` is the residual stream entering block ``il``; ``il = 0`` is the
embedding output.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .errors import TrainError
from .gguf_weights import GGUFTensors, TargetHParams, read_hparams
from .layers import attention, rms_norm, rope

_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
_OPTIONAL = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight")


@dataclass
class KVCache:
    """Key/value cache for batched greedy generation.

    Attributes:
        k, v: per layer ``[B, S_max, Hkv, D]``.
        key_ok: bool ``[B, S_max]``, False for left padding.
        n: cells written so far.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    key_ok: torch.Tensor
    n: int = 0


class TorchTarget:
    """A GGUF target run by PyTorch (inference only, weights frozen).

    Args:
        path: target GGUF (qwen2, qwen3 or llama architecture).
        device: torch device. dtype: compute dtype of the weights (norms and
            RoPE are computed in float32 whatever it is).
        n_layers: load only blocks ``0 .. n_layers-1`` (features of shallower
            layers need no deeper block); default all, which ``generate`` needs.
    Raises:
        TrainError: unreadable GGUF, unsupported architecture, missing tensor.
    """

    def __init__(self, path: str | os.PathLike, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, n_layers: int | None = None):
        g = GGUFTensors(path)
        try:
            self.hp: TargetHParams = read_hparams(g)
            self.device, self.dtype = torch.device(device), dtype
            self.n_loaded = self.hp.n_layer if n_layers is None else max(0, min(n_layers, self.hp.n_layer))
            self.embd = self._t(g.load("token_embd.weight"))
            self.out_norm = self._t(g.load("output_norm.weight"), torch.float32)
            self.head = self.embd if self.hp.tied else self._t(g.load("output.weight"))
            self.blocks = [self._block(g, i) for i in range(self.n_loaded)]
        finally:
            g.close()

    def _t(self, a, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.from_numpy(a).to(device=self.device, dtype=dtype or self.dtype)

    def _block(self, g: GGUFTensors, i: int) -> dict[str, torch.Tensor]:
        b = {n: self._t(g.load(f"blk.{i}.{n}.weight"), torch.float32 if n.endswith("norm") else None)
             for n in _BLOCK}
        for n in _OPTIONAL:
            if f"blk.{i}.{n}" in g:
                b[n] = self._t(g.load(f"blk.{i}.{n}"), torch.float32)
        return b

    # -- pieces ----------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[..., n_embd]`` of integer ids (the target's frozen table)."""
        return F.embedding(ids.to(self.device), self.embd)

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., n_vocab]`` of already-normalised hidden states ``h`` (no final norm)."""
        return h.to(self.head.dtype) @ self.head.T

    def _qkv(self, b: dict, x: torch.Tensor, pos: torch.Tensor):
        hp = self.hp
        B, T, _ = x.shape
        h = rms_norm(x, b["attn_norm"], hp.rms_eps)
        q, k, v = (h @ b[n].T for n in ("attn_q", "attn_k", "attn_v"))
        if "attn_q.bias" in b:
            q, k, v = (t + b[f"attn_{n}.bias"].to(t.dtype) for t, n in ((q, "q"), (k, "k"), (v, "v")))
        q = q.view(B, T, hp.n_head, hp.head_dim)
        k = k.view(B, T, hp.n_head_kv, hp.head_dim)
        v = v.view(B, T, hp.n_head_kv, hp.head_dim)
        if "attn_q_norm.weight" in b:
            q, k = rms_norm(q, b["attn_q_norm.weight"], hp.rms_eps), rms_norm(k, b["attn_k_norm.weight"], hp.rms_eps)
        return rope(q, pos, hp.rope_theta, hp.rope_neox), rope(k, pos, hp.rope_theta, hp.rope_neox), v

    def _mlp(self, b: dict, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, b["ffn_norm"], self.hp.rms_eps)
        return (F.silu(h @ b["ffn_gate"].T) * (h @ b["ffn_up"].T)) @ b["ffn_down"].T

    # -- features --------------------------------------------------------------------------
    @torch.no_grad()
    def layer_inputs(self, ids: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
        """Concatenated layer-input features of causal sequences.

        Args:
            ids: int64 ``[B, T]`` token ids, positions ``0 .. T-1`` (right
                padding is harmless: attention is causal).
            layers: layer-input indices ``il`` (0 = embedding output); block
                ``il`` itself need not be loaded (only ``0 .. il-1``).
        Returns:
            ``[B, T, len(layers) · n_embd]`` in the compute dtype.
        Raises:
            TrainError: a layer index outside the loaded blocks.
        """
        return self._forward(ids, layers, final=False)[0]

    @torch.no_grad()
    def layer_inputs_and_final(self, ids: torch.Tensor, layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer_inputs`` and the final hidden states after the output norm, ``[B, T, n_embd]``
        (``lm_head`` of row t gives the target's logits for the token at t + 1).

        Raises:
            TrainError: as ``layer_inputs``, or not every block loaded.
        """
        if self.n_loaded < self.hp.n_layer:
            raise TrainError(f"the final hidden states need all {self.hp.n_layer} blocks, {self.n_loaded} loaded")
        return self._forward(ids, layers, final=True)

    def _forward(self, ids: torch.Tensor, layers: Sequence[int], final: bool):
        bad = [il for il in layers if not 0 <= il <= min(self.n_loaded, self.hp.n_layer - 1)]
        if not layers or bad:
            raise TrainError(f"layer inputs {bad or list(layers)} are not available: the target has "
                             f"{self.hp.n_layer} blocks, {self.n_loaded} loaded")
        want = {il: None for il in layers}
        x = self.embed(ids)
        pos = torch.arange(ids.shape[1], device=self.device)
        last = self.hp.n_layer if final else max(layers)
        for il in range(last + 1):
            if il in want:
                want[il] = x
            if il == last:
                break
            b = self.blocks[il]
            q, k, v = self._qkv(b, x, pos)
            x = x + attention(q, k, v, None, causal=True) @ b["attn_output"].T
            x = x + self._mlp(b, x)
        feats = torch.cat([want[il] for il in layers], dim=-1)
        return feats, (rms_norm(x, self.out_norm, self.hp.rms_eps) if final else None)

    # -- cached decoding -------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int, key_ok: torch.Tensor) -> KVCache:
        """An empty cache for ``batch`` rows of up to ``max_len`` cells; ``key_ok`` bool ``[B, max_len]``."""
        hp = self.hp
        shape = (batch, max_len, hp.n_head_kv, hp.head_dim)
        z = lambda: torch.zeros(shape, device=self.device, dtype=self.dtype)  # noqa: E731
        return KVCache([z() for _ in self.blocks], [z() for _ in self.blocks], key_ok.to(self.device))

    @torch.no_grad()
    def step(self, ids: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Decode ``ids [B, t]`` at ``pos [B, t]`` into cells ``cache.n ..``.

        Returns the last row's logits ``[B, n_vocab]`` (float32).

        Each query attends to the valid cached cells at or before its own cell
        (and always to itself, so left-padding rows stay finite).
        Raises TrainError when the cache would overflow or not all blocks are loaded.
        """
        if self.n_loaded != self.hp.n_layer:
            raise TrainError("generation needs every target block: load TorchTarget with n_layers=None")
        B, t = ids.shape
        n0, n1 = cache.n, cache.n + t
        if n1 > cache.key_ok.shape[1]:
            raise TrainError(f"KV cache overflow: {n1} cells needed, {cache.key_ok.shape[1]} allocated")
        cells = torch.arange(n1, device=self.device)
        qcell = torch.arange(n0, n1, device=self.device)
        mask = cache.key_ok[:, None, :n1] & (cells[None, None, :] <= qcell[None, :, None])
        mask = (mask | (cells[None, None, :] == qcell[None, :, None]))[:, None]
        x = self.embed(ids)
        pos = pos.to(self.device)
        for li, b in enumerate(self.blocks):
            q, k, v = self._qkv(b, x, pos)
            cache.k[li][:, n0:n1], cache.v[li][:, n0:n1] = k, v
            x = x + attention(q, cache.k[li][:, :n1], cache.v[li][:, :n1], mask) @ b["attn_output"].T
            x = x + self._mlp(b, x)
        cache.n = n1
        return self.lm_head(rms_norm(x[:, -1], self.out_norm, self.hp.rms_eps)).float()

    @torch.no_grad()
    def decode_one(self, tok: torch.Tensor, pos: torch.Tensor, cell: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token per row with static shapes (CUDA-graph friendly): logits ``[B, n_vocab]`` float32.

        Args:
            tok, pos: int64 ``[B, 1]``. cell: int64 ``[1]``, the cache cell written
                (the same for every row). cache: its ``n`` is not used or changed.
        Attends over the whole cache, masked to valid cells ``≤ cell``.
        """
        cells = torch.arange(cache.key_ok.shape[1], device=self.device)
        mask = (cache.key_ok & (cells[None, :] <= cell))[:, None, None, :]
        x = self.embed(tok)
        for li, b in enumerate(self.blocks):
            q, k, v = self._qkv(b, x, pos)
            cache.k[li].index_copy_(1, cell, k)
            cache.v[li].index_copy_(1, cell, v)
            x = x + attention(q, cache.k[li], cache.v[li], mask) @ b["attn_output"].T
            x = x + self._mlp(b, x)
        return self.lm_head(rms_norm(x[:, -1], self.out_norm, self.hp.rms_eps)).float()


class Decoder:
    """Repeated ``decode_one`` for a fixed batch and cache; replayed as a CUDA graph on a GPU.

    Call ``(tok [B], pos [B], cell: int) -> logits [B, n_vocab]`` (float32; on
    CUDA a view that the next call overwrites). On the CPU it runs eagerly.
    ``first_cell`` is the cell of the first call (capture writes there first).
    """

    def __init__(self, target: TorchTarget, cache: KVCache, batch: int, first_cell: int):
        self.t, self.cache = target, cache
        dev = target.device
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.cell = torch.full((1,), first_cell, dtype=torch.long, device=dev)
        self.graph = None
        if dev.type == "cuda":
            self._capture()

    def _capture(self) -> None:
        """Capture one step; warm-up and capture write only ``first_cell``, which the first call overwrites."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):  # warm-up outside the graph
                self.t.decode_one(self.tok, self.pos, self.cell, self.cache)
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.t.decode_one(self.tok, self.pos, self.cell, self.cache)

    def __call__(self, tok: torch.Tensor, pos: torch.Tensor, cell: int) -> torch.Tensor:
        self.tok.copy_(tok.view(-1, 1))
        self.pos.copy_(pos.view(-1, 1))
        self.cell.fill_(cell)
        if self.graph is None:
            return self.t.decode_one(self.tok, self.pos, self.cell, self.cache)
        self.graph.replay()
        return self.out
