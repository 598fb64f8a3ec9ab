"""Training checkpoints: written atomically, read with clear errors.

A checkpoint is one ``torch.save`` file (format ``tfm-train-ckpt-v1``)
holding the drafter config, the fit options, model / optimiser / scheduler
state, the position in the run (step, epoch, batch of the epoch), the RNG
state and the identities of the corpus and target it was trained on.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..files.atomic import atomic_output
from ..files.dflash import DFlashConfig
from .errors import CorruptArtifactError

FORMAT = "tfm-train-ckpt-v1"


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` (plus the format tag) to ``path``; the file appears only when complete."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint on the CPU.

    Raises:
        FileNotFoundError: no such file.
        CorruptArtifactError: truncated, corrupt, or not a tfm-train checkpoint.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # pickle/zip errors come in many types
        raise CorruptArtifactError(f"checkpoint {path} is corrupt or truncated ({type(e).__name__}: {e}); "
                                   "delete it to start over") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CorruptArtifactError(f"{path} is not a tfm-train checkpoint ({FORMAT})")
    return state


def config_from_dict(d: dict) -> DFlashConfig:
    """Inverse of ``dataclasses.asdict`` for a DFlashConfig (a checkpoint's ``config``)."""
    return DFlashConfig(**{**d, "target_layer_ids": tuple(d["target_layer_ids"])})
