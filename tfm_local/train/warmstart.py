"""Starting a new fit from the weights of an existing drafter (``tfm-train fit --init-from``).

The source is a z-lab layout folder (``config.json`` + safetensors,
F32/F16/BF16, e.g. ``run/export/hf``), a ``tfm-train`` checkpoint file
(``checkpoint.pt``) or a drafter GGUF (any type the ``gguf`` package can
dequantize, e.g. the shipped q4_0 drafter: its dequantized values are the
start, not the weights it was quantized from). Only its config and weights are taken: the new run gets
a fresh optimiser and learning-rate schedule. The source is identified by
its path and the sha256 of its weight file(s), recorded in the new run's
checkpoint and log.

A run that starts from no drafter gets a fresh config: ``drafter_config`` (the converter's geometry),
with the shape options the user gave (``ShapeRequest``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from tfm_convert.errors import ConvertError
from tfm_convert.random_init import random_config
from tfm_convert.target_info import read_target_info

from ..files.dflash import DFlashConfig, expected_shapes
from .checkpoint import config_from_dict, load_checkpoint
from .errors import TrainError


@dataclass
class InitSource:
    """Config, weights and identity of a warm-start source.

    Attributes:
        config: the drafter config (the new run keeps this shape).
        state: model ``state_dict`` (names as ``DFlashDraft``), float32 CPU tensors.
        record: ``{"path", "kind" ("zlab" | "checkpoint" | "gguf"), "sha256", "files"}``;
            ``sha256`` is that of the weight file (of the concatenation of the
            ``files`` in that order when the weights are sharded); for a
            checkpoint also ``"step"`` (its training step).
    """

    config: DFlashConfig
    state: dict[str, torch.Tensor]
    record: dict


def sha256_files(paths: list[Path], chunk: int = 1 << 22) -> str:
    """Hex sha256 of the concatenated bytes of ``paths`` (in the given order), read ``chunk`` bytes at a time."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    return h.hexdigest()


def _zlab_files(folder: Path) -> list[Path]:
    """The safetensors files of a z-lab folder, in name order (the index's shards, or every ``*.safetensors``)."""
    import json

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = json.loads(index.read_text())["weight_map"].values()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise TrainError(f"--init-from {folder}: malformed {index.name} ({e})") from None
        return sorted({folder / n for n in names})
    return sorted(folder.glob("*.safetensors"))


def _load_zlab(folder: Path) -> InitSource:
    from tfm_convert.validate import check_config, check_tensors
    from tfm_convert.zlab import index_tensors, read_config

    config = read_config(folder)
    check_config(config)
    tensors = index_tensors(folder)
    check_tensors({n: t.shape for n, t in tensors.items()}, config.dims)
    wanted = expected_shapes(config.dims)  # the drafter's own tensors (shared embedding / head left out)
    state = {n: torch.from_numpy(t.load()) for n, t in tensors.items() if n in wanted}
    files = _zlab_files(folder)
    record = {"path": str(folder.resolve()), "kind": "zlab", "files": [f.name for f in files],
              "sha256": sha256_files(files)}
    return InitSource(config, state, record)


def _load_checkpoint(path: Path) -> InitSource:
    ck = load_checkpoint(path)
    try:
        config, state = config_from_dict(ck["config"]), ck["model"]
    except (KeyError, TypeError) as e:
        raise TrainError(f"--init-from {path}: checkpoint lacks its config or weights ({e})") from None
    record = {"path": str(path.resolve()), "kind": "checkpoint", "files": [path.name],
              "sha256": sha256_files([path]), "step": int(ck.get("step", 0))}
    return InitSource(config, {k: v.detach().float().cpu() for k, v in state.items()}, record)


def _load_gguf(path: Path, info) -> InitSource:
    """A drafter GGUF; ``info`` (the target's TargetInfo, or None) gives a vocabulary-less file its size."""
    from tfm_convert.read_drafter import read_drafter_gguf

    vocab, depth = (info.n_vocab, info.n_layer) if info is not None else (None, 0)
    config, weights = read_drafter_gguf(path, vocab, depth)
    record = {"path": str(path.resolve()), "kind": "gguf", "files": [path.name], "sha256": sha256_files([path])}
    return InitSource(config, {k: torch.from_numpy(v) for k, v in weights.items()}, record)


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def load_init_source(path: str | os.PathLike, target: str | os.PathLike | None = None) -> InitSource:
    """Read a warm-start source and check it fits ``target``.

    Args:
        path: z-lab layout folder, ``tfm-train`` checkpoint file or drafter GGUF.
        target: the target GGUF of the new run (width, vocabulary, mask token
            and feature layers are checked against it); None skips the check.
    Raises:
        FileNotFoundError: no such file or folder.
        TrainError: malformed source, tensors that do not match its config, or
            a drafter that does not fit the target.
        CorruptArtifactError: a corrupt checkpoint file.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--init-from {path}: no such file or folder")
    try:
        info = None
        if target is not None:
            info = read_target_info(target)
        if path.is_dir():
            src = _load_zlab(path)
        else:
            src = _load_gguf(path, info) if _is_gguf(path) else _load_checkpoint(path)
        if info is not None:
            from tfm_convert.validate import check_against_target

            check_against_target(src.config, info)
    except ConvertError as e:
        raise TrainError(f"--init-from {path}: {e}") from None
    return src


def grow_layers(src: InitSource, n_layers: int) -> InitSource:
    """The source deepened to ``n_layers`` layers (``tfm-train fit --grow-layers``).

    Its layers come first, unchanged; each new layer is appended before the final norm with its two
    residual-branch output projections (``self_attn.o_proj``, ``mlp.down_proj``) at zero, so the
    grown drafter computes exactly what the source computes, and training opens the new layers from
    there (zero-initialised residual branches). The new layers' other weights are left out of
    ``state``: the new model's own seeded initialisation gives them (:func:`load_source`).
    ``record`` gains ``"grown_from_layers"``.

    Raises:
        TrainError: ``n_layers`` is not above the source's layer count.
    """
    have = src.config.num_hidden_layers
    if n_layers <= have:
        raise TrainError(f"--grow-layers {n_layers}: the drafter to grow has {have} layers already")
    config = dataclasses.replace(src.config, num_hidden_layers=n_layers)
    shapes = expected_shapes(config.dims)
    zeros = {name: torch.zeros(shapes[name]) for il in range(have, n_layers)
             for name in (f"layers.{il}.self_attn.o_proj.weight", f"layers.{il}.mlp.down_proj.weight")}
    return InitSource(config, {**src.state, **zeros}, {**src.record, "grown_from_layers": have})


def load_source(model: torch.nn.Module, src: InitSource) -> None:
    """Load ``src.state`` into ``model``; of a grown source (:func:`grow_layers`) the new layers' weights
    other than their zero output projections keep the model's initialisation.

    Raises:
        TrainError: names that fit neither (a source and model of different layouts).
    """
    grown = src.record.get("grown_from_layers")
    missing, unexpected = model.load_state_dict(src.state, strict=False)
    if grown is not None:
        missing = [k for k in missing if not (k.startswith("layers.") and int(k.split(".")[1]) >= grown)]
    if model.config.dflash2 and not src.config.dflash2:  # DFlash → DFlash2: the new parts start as the identity
        missing = [k for k in missing if not (k.startswith("candidate_selector.") or "_conv." in k)]
    if missing or unexpected:
        raise TrainError(f"--init-from {src.record['path']}: weights do not fit the drafter "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")


def drafter_config(target: str | os.PathLike, layers: int, ffn: int | None, n_target_layers: int = 5,
                   mask_token: int | None = None) -> DFlashConfig:
    """A fresh drafter config for ``target`` (tfm_convert's geometry: heads, 5 spread layers, mask token)."""
    return random_config(read_target_info(target), layers=layers, ffn=ffn, n_target_layers=n_target_layers,
                         mask_token=mask_token)


@dataclass(frozen=True)
class ShapeRequest:
    """Drafter-shape options the user gave explicitly (None = not given), checked against a config."""

    layers: int | None = None
    ffn: int | None = None
    target_layers: int | None = None
    mask_token: int | None = None
    dflash2: bool | None = None
    selector_rank: int | None = None  # DFlash2's selector rank (``random_init.dflash2_geometry``)

    def new_config(self, target: str | os.PathLike) -> DFlashConfig:
        """A fresh drafter config for ``target``: the given options, else 5 layers, 3 × hidden MLP, 5 target
        layers; DFlash2 (``random_init.dflash2_geometry``) when asked."""
        config = drafter_config(target, 5 if self.layers is None else self.layers, self.ffn,
                                5 if self.target_layers is None else self.target_layers, self.mask_token)
        return self.upgrade(config)

    def upgrade(self, config: DFlashConfig) -> DFlashConfig:
        """``config`` as a DFlash2 drafter's when ``dflash2`` is asked and it is a DFlash one (a warm start
        from a DFlash drafter: the new convolutions and selector start as the identity, ``model``)."""
        if not self.dflash2 or config.dflash2:
            return config
        from tfm_convert.random_init import dflash2_geometry

        return dataclasses.replace(config, **dflash2_geometry(config.hidden_size, config.vocab_size,
                                                              self.selector_rank))

    def mismatches(self, config: DFlashConfig) -> list[str]:
        """``"--option N (drafter: M)"`` for each given option that ``config`` does not have."""
        have = {"layers": config.num_hidden_layers, "ffn": config.intermediate_size,
                "target_layers": len(config.target_layer_ids), "mask_token": config.mask_token_id,
                "dflash2": config.dflash2, "selector_rank": config.selector_rank}
        return [f"--{k.replace('_', '-')} {v} (drafter: {have[k]})" for k, v in vars(self).items()
                if v is not None and v != have[k]]
