"""The Weaver: a small autoregressive adapter that re-scores the drafter's top-K candidates of each
block position, conditioned on the path of realised tokens that leads there (Trees from Marginals,
arXiv 2607.06763; facts in docs/design.md §5).

Inputs of one draft (one anchor):

- the **prefix**: the target's final hidden state (after its output norm) at the last committed token,
  then the drafter's hidden states (after its final norm) at block positions 1..D, each normalised and
  projected to the Weaver's width. Every layer reads the prefix as extra keys and values (it is not
  updated by the layers), at RoPE positions 0 (target) and 1..D (drafter).
- the **steps**: the path's tokens as the target's own embeddings (normalised, projected): step s holds
  the token at depth s (s = 0: the root, the last token emitted) at RoPE position s + 1, and scores the
  candidates of depth s + 1. A step attends to the whole prefix and to the steps of its own path up to
  itself (in a tree: its ancestors).
- the **candidates** of depth s + 1: the drafter's K best tokens there and their drafter logits.

Output: ``logit_c = drafter_logit_c + <code_c, q>`` for each candidate c, with ``q`` the last block's
normalised output projected to ``rank`` dimensions and ``code_c = P · W_lm[c]`` (the target's LM-head
row of c through a learned low-rank projection P); a softmax over the K candidates alone. The
vocabulary is never projected. The output projection starts at zero, so a fresh Weaver scores the
candidates as the drafter does.

Shapes: N drafts, D block positions, S ≤ D steps, K candidates, H_t / H_d the target's and the
drafter's hidden sizes, W the width, r the rank. Float tensors in the model's dtype; ids int64.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import attention, rope
from .model import RMSNorm


@dataclass
class WeaverConfig:
    """Shape of a Weaver.

    Attributes:
        target_hidden / drafter_hidden: H_t and H_d (from the pair it is trained for).
        depth: D, the block positions it scores (the drafter's block size − 1).
        top_k: K, the candidates per position (the paper: 512).
        width, layers, heads, ffn: the blocks (pre-norm attention with RoPE, SwiGLU MLP).
        rank: r, the dimension of q and of the candidates' codes.
        rope_theta, eps: RoPE base and RMSNorm epsilon.
    """

    target_hidden: int
    drafter_hidden: int
    depth: int = 15
    top_k: int = 64
    width: int = 256
    layers: int = 1
    heads: int = 4
    ffn: int = 768
    rank: int = 64
    rope_theta: float = 10000.0
    eps: float = 1e-6

    def __post_init__(self):
        if self.width % self.heads or (self.width // self.heads) % 2:
            raise ValueError(f"width {self.width} must split into {self.heads} heads of an even size")
        for name in ("target_hidden", "drafter_hidden", "depth", "top_k", "width", "layers", "heads", "ffn", "rank"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"WeaverConfig.{name} must be at least 1, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "WeaverConfig":
        """Raises ValueError for unknown or missing fields (a checkpoint of another format)."""
        known = set(cls.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise ValueError(f"unknown Weaver config fields {sorted(extra)}")
        return cls(**d)


class WeaverBlock(nn.Module):
    """Pre-norm attention over (prefix, steps) with RoPE, then a SwiGLU MLP; the prefix is read as
    keys and values through this block's own projections (after its own norm), never updated."""

    def __init__(self, c: WeaverConfig):
        super().__init__()
        self.heads, self.head_dim, self.theta = c.heads, c.width // c.heads, c.rope_theta
        self.attn_norm = RMSNorm(c.width, c.eps)
        self.prefix_norm = RMSNorm(c.width, c.eps)
        self.q, self.k, self.v, self.o = (nn.Linear(c.width, c.width, bias=False) for _ in range(4))
        self.mlp_norm = RMSNorm(c.width, c.eps)
        self.gate = nn.Linear(c.width, c.ffn, bias=False)
        self.up = nn.Linear(c.width, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.width, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], self.heads, self.head_dim)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, prefix: torch.Tensor, prefix_pos: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """x ``[N, S, W]`` at ``pos`` ``[S]``; prefix ``[N, P, W]`` at ``prefix_pos`` ``[P]``; mask bool
        ``[1|N, 1, S, P + S]`` (True = may attend). Returns ``[N, S, W]``."""
        h = self.attn_norm(x)
        p = self.prefix_norm(prefix)
        q = rope(self._heads(self.q(h)), pos, self.theta)
        k = torch.cat([rope(self._heads(self.k(p)), prefix_pos, self.theta), rope(self._heads(self.k(h)), pos, self.theta)], 1)
        v = torch.cat([self._heads(self.v(p)), self._heads(self.v(h))], 1)
        x = x + self.o(attention(q, k, v, mask))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Weaver(nn.Module):
    """The Weaver (module doc). ``forward`` scores the candidates of every step of N paths at once."""

    def __init__(self, config: WeaverConfig):
        super().__init__()
        c = self.config = config
        self.target_norm, self.target_proj = RMSNorm(c.target_hidden, c.eps), nn.Linear(c.target_hidden, c.width, bias=False)
        self.drafter_norm, self.drafter_proj = RMSNorm(c.drafter_hidden, c.eps), nn.Linear(c.drafter_hidden, c.width, bias=False)
        self.step_norm, self.step_proj = RMSNorm(c.target_hidden, c.eps), nn.Linear(c.target_hidden, c.width, bias=False)
        self.blocks = nn.ModuleList(WeaverBlock(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.width, c.eps)
        self.out = nn.Linear(c.width, c.rank, bias=False)
        self.code = nn.Linear(c.target_hidden, c.rank, bias=False)  # P, applied to LM-head rows
        nn.init.zeros_(self.out.weight)  # a fresh Weaver = the drafter's scores

    def prefix(self, h_target: torch.Tensor, h_drafter: torch.Tensor) -> torch.Tensor:
        """``[N, 1 + D, W]`` from the target's final hidden state ``[N, H_t]`` and the drafter's
        hidden states ``[N, D, H_d]``."""
        t = self.target_proj(self.target_norm(h_target))[:, None]
        return torch.cat([t, self.drafter_proj(self.drafter_norm(h_drafter))], 1)

    def codes(self, head_rows: torch.Tensor) -> torch.Tensor:
        """The candidates' codes ``[..., r]`` from their LM-head rows ``[..., H_t]``."""
        return self.code(head_rows)

    def forward(self, h_target: torch.Tensor, h_drafter: torch.Tensor, step_emb: torch.Tensor,
                cand_logit: torch.Tensor, cand_code: torch.Tensor, mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Corrected candidate logits.

        Args:
            h_target: ``[N, H_t]``; h_drafter: ``[N, D, H_d]`` (the prefix).
            step_emb: ``[N, S, H_t]`` the target's embeddings of the path tokens at depths 0..S-1.
            cand_logit: ``[N, S, K]`` the drafter's logits of the candidates of depths 1..S.
            cand_code: ``[N, S, K, r]`` their codes (``codes``).
            mask: bool ``[1|N, 1, S, 1 + D + S]`` (True = may attend); None = every step sees the
                whole prefix and the steps up to itself (one path).
        Returns:
            ``[N, S, K]`` logits; a softmax over the last axis is the Weaver's distribution.
        """
        N, S, _ = step_emb.shape
        D = h_drafter.shape[1]
        if h_drafter.shape[1] > self.config.depth or S > D:
            raise ValueError(f"{D} drafter positions and {S} steps for a Weaver of depth {self.config.depth}")
        dev = step_emb.device
        prefix = self.prefix(h_target, h_drafter)
        if mask is None:
            mask = path_mask(S, 1 + D, dev)
        pos, prefix_pos = torch.arange(1, S + 1, device=dev), torch.arange(1 + D, device=dev)
        x = self.step_proj(self.step_norm(step_emb))
        for block in self.blocks:
            x = block(x, pos, prefix, prefix_pos, mask)
        q = self.out(self.norm(x))                                  # [N, S, r]
        return cand_logit + torch.einsum("nskr,nsr->nsk", cand_code.to(q.dtype), q).to(cand_logit.dtype)


def path_mask(n_steps: int, n_prefix: int, device=None) -> torch.Tensor:
    """bool ``[1, 1, S, P + S]``: every step sees the prefix and the steps up to itself."""
    steps = torch.ones(n_steps, n_steps, dtype=torch.bool, device=device).tril()
    full = torch.cat([torch.ones(n_steps, n_prefix, dtype=torch.bool, device=device), steps], 1)
    return full[None, None]


def candidate_loss(logits: torch.Tensor, cand: torch.Tensor, labels: torch.Tensor, ignore: int = -100
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross-entropy of the target's token over the candidates, where it is one of them.

    Args:
        logits: ``[N, S, K]`` (``Weaver.forward``, or the drafter's candidate logits).
        cand: int ``[N, S, K]`` candidate ids. labels: int ``[N, S]`` the target's tokens (``ignore``
            where there is none).
    Returns:
        (loss summed over the rows whose label is a candidate, bool ``[N, S]`` those rows, bool
        ``[N, S]`` whether the top-1 candidate is the label).
    """
    hit = cand == labels[..., None]                              # [N, S, K]
    rows = hit.any(-1) & (labels != ignore)
    logp = torch.log_softmax(logits.float(), -1)
    loss = -(logp * hit).sum(-1)[rows].sum()
    top1 = torch.gather(cand, -1, logits.argmax(-1, keepdim=True))[..., 0] == labels
    return loss, rows, top1 & (labels != ignore)


def accepted_prefix(top1: torch.Tensor) -> torch.Tensor:
    """Per draft, the number of leading positions whose top-1 is the target's token (``[N]`` int64):
    the tokens a chain of the top-1 candidates would have had accepted (teacher-forced path)."""
    return torch.cumprod(top1.long(), -1).sum(-1)
