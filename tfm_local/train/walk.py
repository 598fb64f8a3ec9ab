"""Held-out τ measured as the engine does: each response walked step by step.

The fit's held-out proxy (``heldout.evaluate``) averages the accepted length over anchors drawn
uniformly from the responses, so easy stretches (long runs the drafter gets right) weigh as much as the
hard ones where a decode spends its steps: it read 3.7–3.8 where ``tfm-bench`` read 2.4–3.7.
Here each response is walked with the engine's step rule (``bench.replay.replay_chain``'s): the first
response token comes from the prefill, every step anchors on the last token emitted, drafts
``min(block - 1, tokens left - 1)`` tokens, accepts the longest prefix the target's tokens spell (the
deepest matching node of the tree) and emits those plus the target's own next token; τ = tokens emitted
over steps, pooled over the sequences (tfm-bench's). At temperature 0 the engine emits the target's
greedy output, so on greedy responses (a greedy corpus, or tfm-bench's recorded ``output_ids``) this is
the engine's τ; on sampled responses it is the τ of a greedy verifier that happened to emit them.

The drafter's block at an anchor depends only on the tokens before it, so every anchor of a response
is drafted in a few batched passes (``block_candidates``) and the walk itself runs on the host: the chain
(top-1 at each position) and DDTree@``budget`` on the top-``top_k`` log-probabilities (the engine's tree
and default of 8 candidates a position).
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Callable

import numpy as np
import torch

from ..decode.tree import build_ddtree
from .batching import IGNORE
from .model import block_mask
from .recipe import head_topk
from .weaver_eval import accepted_length

#: anchors drafted in one pass (block_size query rows each)
CHUNK = 64


def walk(n_out: int, max_tokens: int, budget: int, accepted: Callable[[int, int], int]) -> tuple[int, int]:
    """(steps, tokens emitted by the steps) of the engine's walk over a response of ``n_out`` tokens.

    Args:
        max_tokens: the generation's cap (the first token, the prefill's, counts; no step emits past it).
        budget: most drafts a step (block size - 1).
        accepted: ``accepted(i, k)`` drafts of ``k`` accepted at the step anchored on response token ``i``
            (its labels are the response's tokens ``i + 1 ..``).
    """
    n_gen, i, steps = 1, 0, 0
    while n_gen < max_tokens and i < n_out - 1:
        remaining = max_tokens - n_gen
        k = min(budget, remaining - 1)
        a = accepted(i, k) if k > 0 else 0
        emitted = min(a + 1, remaining, n_out - 1 - i)
        i, n_gen, steps = i + emitted, n_gen + emitted, steps + 1
    return steps, i


@torch.no_grad()
def block_candidates(drafter, target, ids: torch.Tensor, prompt_len: int, top_k: int, autocast: bool,
                     chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """The drafter's top-``top_k`` tokens and log-probabilities at every block position 1 .. S-1 of every
    anchor of a response: int ``[n, S-1, K]`` and float64 ``[n, S-1, K]``, row i anchored on the response's
    token i (position ``prompt_len + i``), i < n = response length - 1.

    Args:
        ids: int64 ``[L]`` on the target's device, prompt then response.
    """
    L, S = len(ids), drafter.config.block_size
    dev = ids.device
    feats = target.layer_inputs(ids[None], drafter.feature_layers).float()
    ctx_pos = torch.arange(L, device=dev)
    offs = torch.arange(S, device=dev)
    cands, logps = [], []
    for lo in range(prompt_len, L - 1, chunk):
        anchors = torch.arange(lo, min(lo + chunk, L - 1), device=dev)
        noise = torch.where(offs == 0, ids[anchors][:, None], drafter.config.mask_token_id).reshape(1, -1)
        pos = (anchors[:, None] + offs).reshape(1, -1)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
            h = drafter(feats, ctx_pos, target.embed(noise).float(), pos, block_mask(anchors[None], L, S))
        h = h.view(len(anchors), S, -1)[:, 1:].float()
        cand, cand_logit, lse = head_topk(target.lm_head, h.reshape(-1, h.shape[-1]), top_k)
        cands.append(cand.view(len(anchors), S - 1, -1).cpu().numpy())
        logps.append((cand_logit - lse).view(len(anchors), S - 1, -1).double().cpu().numpy())
    if not cands:
        return np.zeros((0, S - 1, top_k), np.int64), np.zeros((0, S - 1, top_k))
    return np.concatenate(cands), np.concatenate(logps)


def chain_accepted(cand: np.ndarray, out: np.ndarray) -> Callable[[int, int], int]:
    """``walk``'s ``accepted`` for the chain: the leading drafts (top-1) equal to the response's next tokens."""
    def acc(i: int, k: int) -> int:
        want = out[i + 1:i + 1 + k]
        hit = cand[i, :len(want), 0] == want
        return int(np.argmin(np.append(hit, False)))
    return acc


def ddtree_accepted(cand: np.ndarray, logp: np.ndarray, out: np.ndarray, budget: int) -> Callable[[int, int], int]:
    """``walk``'s ``accepted`` for DDTree@``budget`` over the first ``k`` positions: the depth of the deepest
    node whose path spells the response's next tokens."""
    def acc(i: int, k: int) -> int:
        t = build_ddtree(int(out[i]), cand[i, :k], logp[i, :k], budget)
        labels = np.full(k, IGNORE, np.int64)
        want = out[i + 1:i + 1 + k]
        labels[:len(want)] = want
        return accepted_length(t.parents, t.tokens, labels)
    return acc


@torch.no_grad()
def walk_tau(drafter, target, seqs, device, autocast: bool, kinds: list[str | None] | None = None,
             max_tokens: int | None = None, trees: tuple[int, ...] = (16,), top_k: int = 8) -> dict:
    """Engine-style τ of ``drafter`` over ``seqs`` (``corpus.Sequence``: prompt + response): the chain's and
    DDTree@B's for each B of ``trees``, pooled, and per kind where ``kinds`` (one per sequence, None =
    none) names one.

    Args:
        max_tokens: the generations' cap (tfm-bench's ``--max-tokens``); None = each response's length
            (the corpus was generated with its own cap).
    Returns:
        ``{"walk_sequences": n, "walk_chain": τ, "walk_ddtree@16": τ, "walk_chain/code": τ, ...,
        "walk_sequences/code": n, ...}``.
    """
    was_training = drafter.training
    drafter.eval()
    budget, top_k = drafter.config.block_size - 1, min(top_k, target.head.shape[0])
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [steps, tokens]
    counts: dict[str, int] = defaultdict(int)
    try:
        for n, s in enumerate(seqs):
            out = np.asarray(s.ids[s.prompt_len:], dtype=np.int64)
            if len(out) < 2:
                continue
            cap = len(out) if max_tokens is None else max_tokens
            ids = torch.as_tensor(np.asarray(s.ids, dtype=np.int64), device=device)
            cand, logp = block_candidates(drafter, target, ids, s.prompt_len, top_k, autocast)
            rules = {"chain": chain_accepted(cand, out)}
            rules.update({f"ddtree@{b}": ddtree_accepted(cand, logp, out, b) for b in trees})
            kind = kinds[n] if kinds else None
            counts[""] += 1
            if kind:
                counts[f"/{kind}"] += 1
            for name, rule in rules.items():
                steps, tokens = walk(len(out), cap, budget, rule)
                for key in [name] + ([f"{name}/{kind}"] if kind else []):
                    sums[key][0] += steps
                    sums[key][1] += tokens
    finally:
        drafter.train(was_training)
    res = {f"walk_sequences{k}": v for k, v in counts.items()}
    res.update({f"walk_{k}": t / st if st else 0.0 for k, (st, t) in sums.items()})
    return res


def save_sequences(path, seqs, kinds: list[str], max_tokens: int):
    """Write sequences to walk (e.g. tfm-bench's prompts and recorded greedy outputs) atomically as ``.npz``:
    ``tokens`` int32, ``offsets`` int64 ``[n+1]``, ``prompt_len`` int32, ``kinds`` (UTF-8 JSON list),
    ``max_tokens`` (the generations' cap)."""
    from ..files.atomic import atomic_output

    lens = np.array([len(s.ids) for s in seqs], dtype=np.int64)
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, tokens=np.concatenate([np.asarray(s.ids, np.int32) for s in seqs]) if seqs else np.zeros(0, np.int32),
                     offsets=np.concatenate([[0], np.cumsum(lens)]), prompt_len=np.array([s.prompt_len for s in seqs], np.int32),
                     kinds=np.frombuffer(json.dumps(list(kinds)).encode(), np.uint8), max_tokens=np.array([max_tokens]))
    return path


def load_sequences(path) -> tuple[list, list[str], int]:
    """(sequences, kinds, max_tokens) of a ``save_sequences`` file.

    Raises:
        FileNotFoundError: no such file. CorruptArtifactError: unreadable or inconsistent.
    """
    from pathlib import Path

    from .corpus import Sequence
    from .errors import CorruptArtifactError

    if not Path(path).is_file():
        raise FileNotFoundError(f"sequence file not found: {path}")
    try:
        with np.load(path) as z:
            tok, off, plen = z["tokens"], z["offsets"], z["prompt_len"]
            kinds, cap = json.loads(bytes(z["kinds"]).decode()), int(z["max_tokens"][0])
        if len(off) != len(plen) + 1 or len(kinds) != len(plen) or off[-1] != len(tok) or (np.diff(off) < 0).any():
            raise ValueError("offsets, prompt lengths and kinds disagree")
    except Exception as e:
        raise CorruptArtifactError(f"{path} is not a sequence file: {type(e).__name__}: {e}") from e
    seqs = [Sequence(tok[off[i]:off[i + 1]], int(plen[i]), i) for i in range(len(plen))]
    return seqs, kinds, cap
