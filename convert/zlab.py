"""DFlash checkpoints in the z-lab Hugging Face layout.

A checkpoint folder holds ``config.json`` (``architectures:
["DFlashDraftModel"]``, Qwen3 fields, ``dflash_config {target_layer_ids,
mask_token_id, block_size}``) and ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``). Method and layout: z-lab DFlash
(Chen et al., "DFlash: Block Diffusion for Flash Speculative Decoding").
A DFlash2 checkpoint (``architectures: ["DFlash2DraftModel"]``) adds
``conv_kernel_size``, ``conv_group_size``, ``selector_rank`` and
``selector_top_k`` to ``dflash_config`` and its tensors (``tfm_local.files.dflash``).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tfm_local.files.atomic import atomic_output, write_text
from tfm_local.files.dflash import ARCHITECTURE, ARCHITECTURE_V2, DFlashConfig, strip_prefix

from .errors import ConvertError, convert_errors
from .safetensors_io import LazyTensor, read_safetensors, write_safetensors

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def parse_config(cfg: Any, source: str = "config.json") -> DFlashConfig:
    """Validate a parsed ``config.json`` (DFlash or DFlash2) and extract a DFlashConfig.

    Raises:
        ConvertError: not a DFlash drafter, a missing or mistyped field, or a
            feature llama.cpp's dflash loader path here does not support
            (attention biases, sliding window, RoPE scaling).
    """
    if not isinstance(cfg, dict):
        raise ConvertError(f"{source}: expected a JSON object")
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise ConvertError(f"{source}: architectures must be a list, got {str(archs)[:40]}")
    v2 = ARCHITECTURE_V2 in archs
    if not v2 and ARCHITECTURE not in archs:
        raise ConvertError(f"{source}: architectures is {archs!r}, expected [{ARCHITECTURE!r}] "
                           f"or [{ARCHITECTURE_V2!r}]")
    _refuse_unsupported(cfg, source)
    dflash = cfg.get("dflash_config") or {}
    if not isinstance(dflash, dict):
        raise ConvertError(f"{source}: dflash_config must be an object")
    get = _Getter(cfg, source)
    heads = get.int("num_attention_heads")
    hidden = get.int("hidden_size")
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    ids = dflash.get("target_layer_ids", cfg.get("target_layer_ids"))
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConvertError(f"{source}: dflash_config.target_layer_ids must be a non-empty list of integers")
    mask = dflash.get("mask_token_id")
    if not isinstance(mask, int) or isinstance(mask, bool):
        raise ConvertError(f"{source}: dflash_config.mask_token_id must be an integer, got {mask!r}")
    v2_fields = {}
    if v2:  # DFlash2: every field of its convolution and selector is required, each at least 1
        getter = _Getter(dflash, f"{source}: dflash_config")
        v2_fields = {k: getter.int(k) for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                "selector_top_k")}
        low = [k for k, v in v2_fields.items() if v < 1]
        if low:
            raise ConvertError(f"{source}: dflash_config.{low[0]} must be at least 1, got {v2_fields[low[0]]}")
    return DFlashConfig(
        hidden_size=hidden, num_hidden_layers=get.int("num_hidden_layers"), num_attention_heads=heads,
        num_key_value_heads=get.int("num_key_value_heads", heads), head_dim=get.int("head_dim", hidden // max(heads, 1)),
        intermediate_size=get.int("intermediate_size"), vocab_size=get.int("vocab_size"),
        rms_norm_eps=get.float("rms_norm_eps", 1e-6),
        rope_theta=_Getter(rope, source).float("rope_theta", get.float("rope_theta", 1e6)),
        max_position_embeddings=get.int("max_position_embeddings", 0),
        hidden_act=str(cfg.get("hidden_act", "silu")), target_layer_ids=tuple(ids), mask_token_id=mask,
        block_size=_Getter(dflash, source).int("block_size", get.int("block_size", 16)),
        num_target_layers=get.int("num_target_layers", 0), **v2_fields,
    )


class _Getter:
    """Typed access to config fields with ConvertError on a wrong type."""

    def __init__(self, d: dict, source: str):
        self.d, self.source = d, source

    def int(self, key: str, default: int | None = None) -> int:
        """An integer of the GGUF's 32-bit fields (|v| < 2**31)."""
        v = self.d.get(key, default)
        if v is None or isinstance(v, bool) or not isinstance(v, int) or not -2 ** 31 < v < 2 ** 31:
            raise ConvertError(f"{self.source}: {key} must be an integer of 32 bits, got {str(v)[:40]}")
        return v

    def float(self, key: str, default: float | None = None) -> float:
        """A positive finite number that a 32-bit float holds (the GGUF's float fields)."""
        v = self.d.get(key, default)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 3.4e38:
            raise ConvertError(f"{self.source}: {key} must be a positive finite number, got {str(v)[:40]}")
        return float(v)


def _refuse_unsupported(cfg: dict, source: str) -> None:
    """ConvertError for config features this converter does not map."""
    if cfg.get("attention_bias"):
        raise ConvertError(f"{source}: attention_bias=true is not supported (DFlash blocks have no biases)")
    if cfg.get("use_sliding_window"):
        raise ConvertError(f"{source}: sliding-window drafters are not supported")
    for key in ("rope_scaling", "rope_parameters"):
        rope = cfg.get(key)
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
        if kind not in (None, "default"):
            raise ConvertError(f"{source}: RoPE scaling {kind!r} is not supported")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "gelu", "gelu_pytorch_tanh"):
        raise ConvertError(f"{source}: hidden_act {act!r} is not supported (silu or gelu)")


def read_config(folder: Path) -> DFlashConfig:
    """Read and validate ``folder/config.json``; ConvertError when missing or malformed."""
    path = folder / "config.json"
    if path.exists() and not path.is_file():  # a FIFO or a device would block the read for ever
        raise ConvertError(f"{path} is not a regular file")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"checkpoint {folder} has no config.json") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise ConvertError(f"{path}: malformed config.json ({type(e).__name__}: {str(e)[:200]})") from None
    return parse_config(cfg, str(path))


def index_tensors(folder: Path) -> dict[str, LazyTensor]:
    """Index the safetensors of a checkpoint folder, names without a ``model.`` prefix.

    Uses ``model.safetensors.index.json`` when present, else every
    ``*.safetensors`` file of the folder.

    Raises:
        ConvertError: no weights, an unreadable shard, or a tensor name stored twice.
    """
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConvertError(f"{index}: malformed index ({e})") from None
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"checkpoint {folder} has no .safetensors weights")
    out: dict[str, LazyTensor] = {}
    for f in files:
        for name, t in read_safetensors(f).items():
            key = strip_prefix(name)
            if key in out:
                raise ConvertError(f"checkpoint {folder}: tensor {key!r} is stored twice")
            out[key] = t
    return out


def locate_checkpoint(spec: str) -> Path:
    """A local checkpoint folder for ``spec``: a folder path, or a hub id ``owner/name`` to download.

    Raises:
        ConvertError: no such folder and not a hub id, or the download failed.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists() or not _HUB_ID.match(spec):
        raise ConvertError(f"checkpoint {spec!r} is neither a folder nor a hub id (owner/name)")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(spec, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as e:  # network, auth, missing repo: all user-facing
        raise ConvertError(f"checkpoint {spec!r} is no local folder, and downloading it as a hub id "
                           f"failed: {e}") from None


@convert_errors()
def write_checkpoint(folder: str | os.PathLike, config: DFlashConfig, tensors: dict, dtype: str = "F32") -> Path:
    """Write a z-lab layout checkpoint: ``config.json`` + ``model.safetensors``.

    Args:
        folder: destination folder (created if needed).
        config: the drafter config.
        tensors: HF name → float array.
        dtype: safetensors dtype, "F32", "F16" or "BF16".

    Returns:
        the folder as a Path. Each file appears only when complete.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch_dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]
    with atomic_output(folder / "model.safetensors") as tmp:
        write_safetensors(tmp, tensors, dtype)
    write_text(folder / "config.json", json.dumps(config.to_dict(torch_dtype), indent=2) + "\n")
    return folder
