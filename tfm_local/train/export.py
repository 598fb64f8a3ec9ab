"""Export a trained drafter: the z-lab Hugging Face layout, then GGUF through tfm_convert.

The folder holds ``config.json`` (``architectures: ["DFlashDraftModel"]``,
Qwen3 fields, ``dflash_config {target_layer_ids, mask_token_id,
block_size}``, written by ``tfm_convert.zlab.write_checkpoint``) and
``model.safetensors`` (float32, HF names); ``tfm_convert.pipeline.convert_checkpoint``
turns it into a llama.cpp ``dflash`` GGUF for the target (f32/f16/bf16/q8_0).
"""
from __future__ import annotations

import os
from pathlib import Path

from tfm_convert.pipeline import convert_checkpoint
from tfm_convert.zlab import write_checkpoint

from .checkpoint import config_from_dict, load_checkpoint


def export_hf(checkpoint: str | os.PathLike, folder: str | os.PathLike) -> Path:
    """Write the z-lab layout of a training checkpoint into ``folder``; returns it.

    Raises:
        FileNotFoundError / CorruptArtifactError: unreadable checkpoint.
    """
    state = load_checkpoint(checkpoint)
    config = config_from_dict(state["config"])
    tensors = {k: v.detach().float().cpu().numpy() for k, v in state["model"].items()}
    return write_checkpoint(folder, config, tensors, "F32")


def export(checkpoint: str | os.PathLike, target: str | os.PathLike, out_dir: str | os.PathLike,
           outtypes: tuple[str, ...] = ("f16", "q8_0"), name: str = "drafter") -> dict[str, Path]:
    """Export the HF folder ``out_dir/hf`` and one GGUF per outtype ``out_dir/{name}-{outtype}.gguf``.

    Returns:
        ``{"hf": folder, "<outtype>": gguf path, ...}``.
    Raises:
        ConvertError: the drafter does not fit the target (tfm_convert's checks).
    """
    out_dir = Path(out_dir)
    hf = export_hf(checkpoint, out_dir / "hf")
    paths: dict[str, Path] = {"hf": hf}
    for t in outtypes:
        paths[t] = convert_checkpoint(hf, target, out_dir / f"{name}-{t}.gguf", t)
    return paths
