"""Checks of a drafter checkpoint against its own layout and against the target.

Each check gathers every problem it finds and raises one ConvertError that
names them all, so a user fixes a checkpoint in one round.
"""
from __future__ import annotations

from collections.abc import Mapping

from tfm_local.files.dflash import SHARED_NAMES, DFlashConfig, DrafterDims, expected_shapes

from .errors import ConvertError
from .target_info import TargetInfo


def check_tensors(shapes: Mapping[str, tuple[int, ...]], dims: DrafterDims) -> None:
    """Every expected tensor present with its shape, and nothing else.

    Args:
        shapes: checkpoint tensor name (no ``model.`` prefix) → shape.
        dims: the drafter sizes from its config.

    Raises:
        ConvertError: listing every missing, extra and misshapen tensor.
    """
    want = expected_shapes(dims)
    missing = sorted(set(want) - set(shapes))
    extra = sorted(set(shapes) - set(want) - SHARED_NAMES)
    bad = [f"{n} {tuple(shapes[n])} (expected {want[n]})" for n in sorted(set(want) & set(shapes))
           if tuple(shapes[n]) != want[n]]
    parts = [f"{label}: {', '.join(items)}" for label, items in
             (("missing", missing), ("unexpected", extra), ("misshapen", bad)) if items]
    if parts:
        raise ConvertError("checkpoint tensors do not match its config.json ("
                           f"{dims.n_layers} layers, hidden {dims.hidden}) — " + "; ".join(parts))


#: the largest sizes a drafter config may state: llama.cpp's layer limit (LLAMA_MAX_LAYERS), its block
#: size limit in the engine (draft.MAX_BLOCK), and widths no model comes near (a config stating 2**63
#: layers made the tensor check run for ever: found by fuzzing)
MAX_SIZES = dict(num_hidden_layers=512, hidden_size=1 << 17, num_attention_heads=1 << 12, num_key_value_heads=1 << 12,
                 head_dim=1 << 12, intermediate_size=1 << 20, block_size=256, conv_kernel_size=256,
                 conv_group_size=1 << 17, selector_rank=1 << 14, selector_top_k=1 << 10)


def check_config(config: DFlashConfig) -> None:
    """Internal consistency of the drafter geometry, and sizes within ``MAX_SIZES``; ConvertError
    listing each problem."""
    problems = [f"{k} {getattr(config, k)} exceeds {v}" for k, v in MAX_SIZES.items() if getattr(config, k) > v]
    if len(config.target_layer_ids) > MAX_SIZES["num_hidden_layers"]:
        problems.append(f"{len(config.target_layer_ids)} target_layer_ids exceed {MAX_SIZES['num_hidden_layers']}")
    if min(config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
           config.num_key_value_heads, config.head_dim, config.intermediate_size) <= 0:
        problems.append("sizes must be positive")
    elif config.num_attention_heads % config.num_key_value_heads:
        problems.append(f"num_attention_heads {config.num_attention_heads} is not a multiple of "
                        f"num_key_value_heads {config.num_key_value_heads}")
    if min(config.max_position_embeddings, config.num_target_layers) < 0:
        problems.append("max_position_embeddings and num_target_layers must not be negative")
    if config.block_size < 2:
        problems.append(f"block_size {config.block_size} < 2")
    if len(set(config.target_layer_ids)) != len(config.target_layer_ids):
        problems.append(f"target_layer_ids {list(config.target_layer_ids)} has duplicates")
    if config.dflash2:
        problems += _dflash2_problems(config)
    if problems:
        raise ConvertError("invalid drafter config: " + "; ".join(problems))


def _dflash2_problems(c: DFlashConfig) -> list[str]:
    """What llama.cpp's DFlash2 loader and graph (``src/models/dflash.cpp``) would refuse or break on."""
    out = []
    if min(c.conv_kernel_size, c.conv_group_size, c.selector_rank, c.selector_top_k) < 1:
        out.append("conv_kernel_size, conv_group_size, selector_rank and selector_top_k must be at least 1")
        return out
    if c.hidden_size % c.conv_group_size:
        out.append(f"hidden_size {c.hidden_size} is not a multiple of conv_group_size {c.conv_group_size}")
    if c.hidden_size < c.selector_top_k * (c.selector_top_k + 1):
        # the lattice row (K candidates + K×K scores) is written into a row of the hidden size
        out.append(f"hidden_size {c.hidden_size} is below selector_top_k·(selector_top_k + 1) = "
                   f"{c.selector_top_k * (c.selector_top_k + 1)}, the selector lattice's row")
    if c.selector_top_k > c.vocab_size:
        out.append(f"selector_top_k {c.selector_top_k} exceeds vocab_size {c.vocab_size}")
    return out


def check_against_target(config: DFlashConfig, target: TargetInfo) -> None:
    """The drafter fits the target: width, vocabulary, mask token, target layers.

    Raises:
        ConvertError: listing every mismatch.
    """
    name, problems = target.path.name, []
    if config.hidden_size != target.n_embd:
        problems.append(f"hidden size {config.hidden_size} != target n_embd {target.n_embd}")
    if config.vocab_size != target.n_vocab:
        problems.append(f"vocab_size {config.vocab_size} != target vocabulary {target.n_vocab}")
    if not 0 <= config.mask_token_id < target.n_vocab:
        problems.append(f"mask_token_id {config.mask_token_id} is outside the target vocabulary [0, {target.n_vocab})")
    bad = [i for i in config.target_layer_ids if not 0 <= i < target.n_layer - 1]
    if bad:
        problems.append(f"target_layer_ids {bad} are out of range for a {target.n_layer}-layer target "
                        f"(valid: 0..{target.n_layer - 2}; the feature of id i is the input of layer i+1)")
    if problems:
        raise ConvertError(f"drafter does not fit target {name}: " + "; ".join(problems))
