"""Checks of the PyTorch side against llama.cpp on the same tokens.

* ``feature_cosines``: the PyTorch target's layer inputs vs llama.cpp's
  (``Target.features``), cosine similarity per token, summarised per layer.
* ``drafter_parity``: the PyTorch drafter vs the drafter GGUF run by
  llama.cpp (``DFlashDrafter``), given the same injected features (llama.cpp's)
  and the same block ``[x_P, MASK × 15]``: share of block positions whose
  top-1 token agrees.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

#: Our own sample requests, used to make token sequences for the checks.
SAMPLE_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a short docstring.",
    "Explain in three sentences why the sky looks blue during the day.",
    "List five tips for writing clear commit messages.",
)


@dataclass
class LayerCosine:
    """Cosine similarity of one layer's features over all tokens: mean, minimum, token count."""

    layer: int
    mean: float
    min: float
    n_tokens: int


def sample_sequences(target: str | os.PathLike, max_new: int = 64, threads: int | None = None) -> list[list[int]]:
    """Chat-templated sample prompts plus ``max_new`` greedy tokens of the target (llama.cpp)."""
    from tfm_local.engine import Engine
    from tfm_local.decode.sampling import SamplingParams

    eng = Engine(target, None, n_ctx=1024, n_gpu_layers=0, n_threads=threads)
    try:
        out = []
        for text in SAMPLE_PROMPTS:
            ids = eng.prompt_tokens([{"role": "user", "content": text}])
            out.append(ids + list(eng.generate_ids(ids, max_new, SamplingParams())))
        return out
    finally:
        eng.close()


def llama_features(target: str | os.PathLike, ids: list[int], layers: list[int],
                   threads: int | None = None) -> np.ndarray:
    """llama.cpp's layer inputs ``[len(ids), len(layers) · n_embd]`` float32 (CPU)."""
    from tfm_local.decode.verify import Target

    t = Target(target, n_ctx=max(64, len(ids) + 1), n_batch=min(512, len(ids)), n_gpu_layers=0, n_threads=threads)
    try:
        t.set_features(layers)
        parts: list[np.ndarray] = []
        t.prefill(ids, lambda s, n: parts.append(t.features(slice(0, n), n).copy()))
        return np.concatenate(parts)
    finally:
        t.close()


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)


def feature_cosines(target: str | os.PathLike, seqs: list[list[int]], layers: list[int] | None = None,
                    device: str = "cpu", dtype: torch.dtype = torch.float32,
                    threads: int | None = None) -> list[LayerCosine]:
    """Per-layer cosine between PyTorch and llama.cpp layer inputs on ``seqs``.

    Args:
        target: target GGUF. seqs: token id lists. layers: layer-input indices
            (default: every layer 0 .. n_layer-1).
        device, dtype: of the PyTorch target. threads: llama.cpp CPU threads.
    """
    from .target_torch import TorchTarget

    tt = TorchTarget(target, device, dtype, n_layers=None if layers is None else max(layers))
    layers = list(range(tt.hp.n_layer)) if layers is None else list(layers)
    n = tt.hp.n_embd
    cos: list[list[np.ndarray]] = [[] for _ in layers]
    for ids in seqs:
        ref = llama_features(target, ids, layers, threads)
        got = tt.layer_inputs(torch.tensor([ids], device=tt.device), layers)[0].float().cpu().numpy()
        for j in range(len(layers)):
            cos[j].append(_cos(ref[:, j * n:(j + 1) * n], got[:, j * n:(j + 1) * n]))
    out = []
    for il, parts in zip(layers, cos):
        c = np.concatenate(parts)
        out.append(LayerCosine(il, float(c.mean()), float(c.min()), int(c.size)))
    return out


def load_torch_drafter(path: str | os.PathLike):
    """A ``DFlashDraft`` from a training checkpoint file or a z-lab layout folder (float32, CPU)."""
    from tfm_convert.zlab import index_tensors, read_config

    from .checkpoint import config_from_dict, load_checkpoint
    from .model import DFlashDraft

    path = Path(path)
    if path.is_dir():
        config = read_config(path)
        state = {k: torch.from_numpy(t.load()) for k, t in index_tensors(path).items()}
    else:
        ck = load_checkpoint(path)
        config, state = config_from_dict(ck["config"]), ck["model"]
    model = DFlashDraft(config)
    model.load_state_dict(state)
    return model.eval()


def _block_passes(drafter_gguf, drafter_torch, target, seqs, n_points: int, threads: int | None):
    """The block passes of both drafters that the parity checks compare: for each sequence, ``n_points``
    draft positions P spread over it; both drafters get llama.cpp's features of tokens ``0 .. P-1`` and the
    block ``[ids[P], MASK × (S-1)]`` at ``P ..``. Yields ``(dft, llama.cpp logits [S, n_vocab], PyTorch
    hidden states [S, hidden], the anchor ids[P])``, the llama.cpp drafter's pass just run (its lattice
    readable)."""
    from tfm_local.decode.draft import DFlashDrafter
    from tfm_local.decode.verify import Target

    from .target_torch import TorchTarget

    tt = TorchTarget(target, n_layers=0)
    S = drafter_torch.config.block_size
    for ids in seqs:
        tgt = Target(target, n_ctx=len(ids) + S + 1, n_batch=min(512, max(S, len(ids))), n_gpu_layers=0,
                     n_threads=threads)
        dft = DFlashDrafter(drafter_gguf, tgt, n_gpu_layers=0, n_threads=threads)
        try:
            feats = np.concatenate(_collect(tgt, ids))
            injected = 0
            for P in np.linspace(1, len(ids) - 1, num=min(n_points, len(ids) - 1)).astype(int):
                dft.inject(feats[injected:P], injected)
                injected = P
                ref = block_logits(dft, int(ids[P]), int(P))
                block = torch.tensor([[ids[P]] + [drafter_torch.config.mask_token_id] * (S - 1)])
                h = drafter_torch(torch.from_numpy(feats[None, :P]), torch.arange(P), tt.embed(block),
                                  P + torch.arange(S), None)[0]
                yield dft, ref, h, int(ids[P]), tt
        finally:
            dft.close()
            tgt.close()


@torch.no_grad()
def drafter_parity(drafter_gguf: str | os.PathLike, drafter_torch, target: str | os.PathLike,
                   seqs: list[list[int]], n_points: int = 8, threads: int | None = None) -> tuple[float, int]:
    """Share of block positions where the PyTorch and llama.cpp drafters agree on the top-1 token.

    For each sequence, ``n_points`` draft positions P spread over it: both
    drafters get llama.cpp's features of tokens ``0 .. P-1`` and the block
    ``[ids[P], MASK × (S-1)]`` at ``P ..``; positions 1 .. S-1 are compared.

    Returns:
        (agreement in [0, 1], number of positions compared). threads: llama.cpp CPU threads.
    """
    agree = total = 0
    for _, ref, h, _, tt in _block_passes(drafter_gguf, drafter_torch, target, seqs, n_points, threads):
        got = tt.lm_head(h[1:]).argmax(-1).numpy()
        agree += int((got == ref[1:].argmax(-1)).sum())
        total += len(got)
    return agree / max(total, 1), total


@torch.no_grad()
def lattice_parity(drafter_gguf: str | os.PathLike, drafter_torch, target: str | os.PathLike,
                   seqs: list[list[int]], n_points: int = 8, threads: int | None = None) -> tuple[float, float, int]:
    """A DFlash2 drafter's lattice in llama.cpp against the PyTorch model with the same weights.

    At ``n_points`` positions P of each sequence (as ``drafter_parity``), the block
    ``[ids[P], MASK × (S-1)]``: llama.cpp's candidates and K × K scores of positions 1 .. S-1 against
    the PyTorch selector's scores of the same candidates (``CandidateSelector.scores`` over the PyTorch
    drafter's logits and hidden states), and the greedy walk's first choice of each row.

    The scores differ by ~1e-3 of their magnitude in any case: llama.cpp's CPU product with the target's
    F16 LM head rounds the hidden state to F16 (a DFlash drafter's logits differ from PyTorch's alike).

    Returns:
        (share of rows whose best successor of each predecessor agrees, the largest score difference
        over the largest score magnitude, rows compared).
    """
    from tfm_local.llama import native

    K = drafter_torch.config.selector_top_k
    agree = total = 0
    err = 0.0
    for dft, _, h, anchor, tt in _block_passes(drafter_gguf, drafter_torch, target, seqs, n_points, threads):
        S = h.shape[0]
        cand, scores = native.lattice_rows(dft.ctx.ptr, 1, S - 1, dft.model.n_embd, K)
        c = torch.from_numpy(cand)
        prev = torch.cat([torch.full((1, K), anchor), c[:-1]])
        ref = drafter_torch.candidate_selector.scores(h[1:], torch.gather(tt.lm_head(h[1:]), 1, c), prev, c).numpy()
        err = max(err, float(np.abs(ref - scores).max() / max(np.abs(ref).max(), 1e-9)))
        agree += int((ref.argmax(-1) == scores.argmax(-1)).all(-1).sum())
        total += S - 1
    return agree / max(total, 1), err, total


def block_logits(dft, last_token: int, pos: int) -> np.ndarray:
    """llama.cpp drafter logits ``[S, n_vocab]`` of the block ``[last_token, MASK × (S-1)]`` at ``pos ..``.

    Every block token is marked as an output and row i is block position i.
    (llama.cpp's dflash graph computes logits for every token of the batch
    and ignores the output flags, so flagging only positions 1.. would return
    the rows of positions 0 .. S-2.)
    """
    S = dft.block_size
    dft.ctx.truncate(pos)
    dft.ctx.decode_tokens([last_token] + [dft.mask_token] * (S - 1), pos, "all")
    return dft.ctx.logits(S).copy()


def _collect(tgt, ids: list[int]) -> list[np.ndarray]:
    """Prefill ``ids`` and keep the layer features of every chunk."""
    parts: list[np.ndarray] = []
    tgt.prefill(list(ids), lambda s, n: parts.append(tgt.features(slice(0, n), n).copy()))
    return parts
