"""A randomly initialised DFlash drafter for any target.

Used to exercise the whole pipeline (conversion, loading, drafting) before a
trained drafter exists, and as a starting point for training. Geometry:
hidden size = the target's n_embd; head_dim 128/64/32/16 (the largest that
gives at least 4 heads); KV heads = the largest divisor of the head count
not above a quarter of it; MLP width 3 × hidden (rounded up to 32); block
size 16; 5 target layers spread from shallow to deep (DFlash, §5 of
docs/design.md); mask token = an unused id of the target vocabulary.
A DFlash2 drafter (``dflash2=True``) adds z-lab's defaults where the width
allows: 2 taps, groups of 16 channels, selector rank 256 and 16 candidates
(fewer for narrow targets, ``dflash2_geometry``). ``as_dflash2`` turns a
DFlash drafter into the DFlash2 drafter that drafts exactly as it does.
"""
from __future__ import annotations

import math

import numpy as np

import dataclasses

from tfm_local.files.dflash import DFlashConfig, expected_shapes, is_norm

from .errors import ConvertError
from .target_info import TargetInfo

DEFAULT_BLOCK_SIZE = 16
DEFAULT_TARGET_LAYERS = 5


def attention_geometry(n_embd: int) -> tuple[int, int, int]:
    """(n_heads, n_kv_heads, head_dim) for a hidden size.

    Raises:
        ConvertError: n_embd is not a multiple of 8 (no sensible head size).
    """
    for head_dim in (128, 64, 32, 16, 8):
        if n_embd % head_dim == 0 and n_embd // head_dim >= 4:
            break
    else:
        if n_embd % 8:
            raise ConvertError(f"target n_embd {n_embd} is not a multiple of 8: no head size fits")
        head_dim = 8
    heads = n_embd // head_dim
    kv = max(d for d in range(1, max(1, heads // 4) + 1) if heads % d == 0)
    return heads, kv, head_dim


def spread_target_layers(n_layer: int, count: int = DEFAULT_TARGET_LAYERS) -> list[int]:
    """``count`` distinct 0-based target layers spread from shallow to deep.

    The feature of HF layer id i is the input of target layer i + 1, which
    llama.cpp extracts for i + 1 < n_layer: ids lie in [0, n_layer - 2].
    From layer 1 (0 when there is no spare layer) up to about 90% of the
    depth, evenly spaced; fewer than ``count`` when the target has fewer
    usable layers. E.g. 28 layers → [1, 7, 13, 19, 25]; 2 layers → [0].

    Raises:
        ConvertError: the target has fewer than 2 layers.
    """
    if n_layer < 2:
        raise ConvertError(f"a {n_layer}-layer target has no layer whose output llama.cpp can extract")
    n = max(1, min(count, n_layer - 1))
    lo = 1 if n_layer - 1 > n else 0
    hi = max(lo + n - 1, min(n_layer - 2, n_layer - 1 - n_layer // 10))
    if n == 1:
        return [hi]
    return [int(math.floor(lo + k * (hi - lo) / (n - 1) + 0.5)) for k in range(n)]


def dflash2_geometry(hidden: int, vocab: int, rank: int | None = None) -> dict[str, int]:
    """DFlash2's sizes for a drafter of width ``hidden``: z-lab's (2 taps, groups of 16, rank 256,
    top-16) where they fit; a narrower width gets groups dividing it, rank ≤ hidden / 2 and the most
    candidates K with K·(K+1) ≤ hidden (llama.cpp writes a position's K + K² lattice entries into a
    row of the hidden size).

    ``rank``: the selector's rank instead (its two codebooks are ``vocab × rank`` each: 2 × 151,936 ×
    256 is 156 MB in F16 and 44 MB in q4_0; rank 64 is a quarter of that). A multiple of 32 keeps the
    codebooks quantizable (q8_0 / q4_0 blocks of 32 along a row).

    Raises:
        ConvertError: a width below 6 (no two candidates fit); a rank below 1.
    """
    if rank is not None and rank < 1:
        raise ConvertError(f"the selector's rank must be at least 1, got {rank}")
    top_k = min(16, vocab)
    while top_k > 1 and top_k * (top_k + 1) > hidden:
        top_k -= 1
    if top_k < 2:
        raise ConvertError(f"a width of {hidden} leaves no room for DFlash2's selector lattice")
    group = next(g for g in (16, 8, 4, 2, 1) if hidden % g == 0)
    return dict(conv_kernel_size=2, conv_group_size=group,
                selector_rank=rank if rank is not None else max(1, min(256, hidden // 2)), selector_top_k=top_k)


def random_config(target: TargetInfo, *, layers: int = 1, ffn: int | None = None,
                  block_size: int = DEFAULT_BLOCK_SIZE, mask_token: int | None = None,
                  n_target_layers: int = DEFAULT_TARGET_LAYERS, dflash2: bool = False) -> DFlashConfig:
    """The config of a fresh drafter for ``target``.

    Args:
        target: facts of the target GGUF.
        layers: decoder layers (≥ 1).
        ffn: MLP width (default 3 × hidden rounded up to a multiple of 32).
        block_size: tokens per block.
        mask_token: MASK id (default: ``target.pick_mask_token()``).
        n_target_layers: number of target layers to read (capped by its depth).
        dflash2: a DFlash2 drafter (``dflash2_geometry``).

    Raises:
        ConvertError: bad sizes, or no mask token available.
    """
    if layers < 1 or block_size < 2 or (ffn is not None and ffn < 1):
        raise ConvertError("--layers must be ≥ 1, --ffn ≥ 1 and the block size ≥ 2")
    heads, kv, head_dim = attention_geometry(target.n_embd)
    return DFlashConfig(
        hidden_size=target.n_embd, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim,
        intermediate_size=ffn or -(-3 * target.n_embd // 32) * 32, vocab_size=target.n_vocab,
        rms_norm_eps=1e-6, rope_theta=target.rope_freq_base or 1e6,
        max_position_embeddings=target.n_ctx_train or 4096, hidden_act="silu",
        target_layer_ids=tuple(spread_target_layers(target.n_layer, n_target_layers)),
        mask_token_id=target.pick_mask_token() if mask_token is None else mask_token,
        block_size=block_size, num_target_layers=target.n_layer,
        **(dflash2_geometry(target.n_embd, target.n_vocab) if dflash2 else {}),
    )


def random_tensors(config: DFlashConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights for ``config``, HF names and numpy shapes.

    Matrices are N(0, 1/fan_in) (LeCun normal: activations keep unit scale
    through every projection); norm weights are 1; DFlash2's base kernels are
    the identity (1 on the current position's tap) plus N(0, 0.1²), so that
    every tap and the dynamic part matter. Deterministic for a seed.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(config.dims).items():
        if is_norm(name):
            out[name] = np.ones(shape, dtype=np.float32)
        elif name.endswith(".base_kernel"):
            out[name] = (_identity_kernel(shape) + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return out


def _identity_kernel(shape: tuple[int, ...]) -> np.ndarray:
    """A base kernel [2 sides, taps, hidden] that passes its input through: 1 on tap 0, else 0."""
    k = np.zeros(shape, dtype=np.float32)
    k[:, 0, :] = 1.0
    return k


def as_dflash2(config: DFlashConfig, tensors: dict[str, np.ndarray], seed: int = 0,
               **geometry: int) -> tuple[DFlashConfig, dict[str, np.ndarray]]:
    """The DFlash2 drafter that drafts as the DFlash drafter ``(config, tensors)`` does (the z-lab
    initialisation, docs/design.md §7): identity base kernels and zero kernel projections (every
    convolution passes its input through), zero successor codes (every selector score is the
    candidate's own logit, so the lattice's greedy walk is the drafter's top-1 chain); the
    predecessor codes and the hidden projection random (N(0, 1/fan_in)), where training starts.

    Args:
        config, tensors: a DFlash drafter (HF names, numpy shapes).
        seed: for the random parts.
        geometry: DFlash2 sizes overriding ``dflash2_geometry``'s (``conv_kernel_size``, ...).

    Returns:
        (DFlash2 config, its tensors: ``tensors`` plus the new ones).
    """
    v2 = dataclasses.replace(config, **{**dflash2_geometry(config.hidden_size, config.vocab_size), **geometry})
    rng = np.random.default_rng(seed)
    out = dict(tensors)
    for name, shape in expected_shapes(v2.dims).items():
        if name in out:
            continue
        if name.endswith(".base_kernel"):
            out[name] = _identity_kernel(shape)
        elif name.endswith("kernel_projection.weight") or name.endswith("successor_codebook"):
            out[name] = np.zeros(shape, dtype=np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return v2, out
