"""Read a DFlash drafter GGUF back into its config and float32 weights.

The inverse of ``writer.write_drafter_gguf``: the ``dflash.*`` keys give the
config, the tensors are dequantized with the ``gguf`` package
(``gguf.quants.dequantize``) and renamed to their Hugging Face names
(``tfm_local.files.dflash``). Quantized types come back as their dequantized values, not the
weights they were made from. A drafter shipped without its vocabulary
(``vocab.strip_vocab``) has no vocabulary size of its own: the caller gives it.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tfm_local.files.dflash import GLOBAL_NAMES, LAYER_NAMES, DFlashConfig, expected_shapes
from tfm_local.files.gguf_meta import dequantize_tensor, read_gguf_meta

from .errors import ConvertError, convert_errors
from .target_info import MASK_TOKEN_KEY
from .validate import check_config
from .writer import ARCH, DFLASH2_KEYS

#: GGUF names of the target's embedding and LM head, which some drafter files carry: skipped.
SHARED_GGUF_NAMES = frozenset({"token_embd.weight", "output.weight"})


def hf_name(gguf_tensor: str) -> str:
    """HF drafter tensor name of a GGUF drafter tensor name (inverse of ``dflash.gguf_name``).

    Raises:
        KeyError: not a DFlash drafter tensor name.
    """
    for hf, g in GLOBAL_NAMES.items():
        if g == gguf_tensor:
            return hf
    parts = gguf_tensor.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        for hf, g in LAYER_NAMES.items():
            if g == parts[2]:
                return f"layers.{int(parts[1])}.{hf}"
    raise KeyError(gguf_tensor)


def _config(kv: dict, path: Path, vocab_size: int | None, num_target_layers: int) -> DFlashConfig:
    """The DFlashConfig of a drafter GGUF's metadata (see read_drafter_gguf)."""
    if kv.get("general.architecture") != ARCH:
        raise ConvertError(f"{path} is not a DFlash drafter GGUF "
                           f"(general.architecture {kv.get('general.architecture')!r}, expected {ARCH!r})")

    def req(key: str):
        if key not in kv:
            raise ConvertError(f"{path} lacks the metadata key {key}")
        return kv[key]

    tokens = kv.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if tokens is not None else vocab_size
    if n_vocab is None:
        raise ConvertError(f"{path} carries no vocabulary: give the target's vocabulary size")
    try:
        return _config_of(kv, req, n_vocab, num_target_layers)
    except (TypeError, ValueError, OverflowError) as e:  # a value of another type (a damaged file)
        raise ConvertError(f"{path}: malformed dflash metadata ({e})") from None


def _config_of(kv: dict, req, n_vocab: int, num_target_layers: int) -> DFlashConfig:
    """The DFlashConfig of the ``dflash.*`` values (``req``: a required key's value); TypeError /
    ValueError / OverflowError for a value that is no number."""
    hidden, heads = int(req(f"{ARCH}.embedding_length")), int(req(f"{ARCH}.attention.head_count"))
    return DFlashConfig(
        hidden_size=hidden, num_hidden_layers=int(req(f"{ARCH}.block_count")),
        num_attention_heads=heads, num_key_value_heads=int(kv.get(f"{ARCH}.attention.head_count_kv", heads)),
        head_dim=int(kv.get(f"{ARCH}.attention.key_length", hidden // heads if heads > 0 else 0)),
        intermediate_size=int(req(f"{ARCH}.feed_forward_length")), vocab_size=int(n_vocab),
        rms_norm_eps=float(req(f"{ARCH}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(kv.get(f"{ARCH}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(kv.get(f"{ARCH}.context_length", 0)),
        hidden_act=str(kv.get(f"{ARCH}.hidden_activation", "silu")),
        target_layer_ids=tuple(int(i) - 1 for i in req(f"{ARCH}.target_layers")),
        mask_token_id=int(req(MASK_TOKEN_KEY)), block_size=int(req(f"{ARCH}.block_size")),
        num_target_layers=num_target_layers, **{k: int(kv.get(f"{ARCH}.{k}", 0)) for k in DFLASH2_KEYS})


@convert_errors()
def read_drafter_gguf(path: str | os.PathLike, vocab_size: int | None = None,
                      num_target_layers: int = 0) -> tuple[DFlashConfig, dict[str, np.ndarray]]:
    """Config and float32 weights of a DFlash drafter GGUF.

    Args:
        path: drafter GGUF (``dflash`` architecture; any type gguf can dequantize:
            F32, F16, BF16, Q8_0, Q5_0, Q4_0, ...).
        vocab_size: the target's vocabulary size, used when the file carries no
            vocabulary (ignored when it does).
        num_target_layers: depth of the target, recorded in the config (0 = unknown).
    Returns:
        ``(config, weights)`` (DFlash or DFlash2): weights maps every HF name of ``dflash.expected_shapes``
        to a float32 array of that shape (numpy order).
    Raises:
        ConvertError: unreadable or truncated file, another architecture, a missing or malformed
            key, an invalid geometry (``validate.check_config``), a missing tensor, a tensor of the
            wrong shape or type, an unknown tensor (``token_embd`` / ``output`` copies of the
            target's are skipped), or no vocabulary size.
    """
    path = Path(path)
    meta = read_gguf_meta(path)
    config = _config({k: v.value for k, v in meta.kv.items()}, path, vocab_size, num_target_layers)
    try:  # before the shapes: zero heads or groups divide by zero, 2**31 layers take for ever (fuzzing)
        check_config(config)
    except ConvertError as e:
        raise ConvertError(f"{path}: {e}") from None
    shapes = expected_shapes(config.dims)
    entries = {}
    for e in meta.tensors:
        if e.name in SHARED_GGUF_NAMES:  # a copy of the target's embedding / LM head: not the drafter's
            continue
        try:
            name = hf_name(e.name)
        except KeyError:
            name = None
        if name not in shapes:
            raise ConvertError(f"{path}: unexpected tensor {e.name!r} in a DFlash drafter of "
                               f"{config.num_hidden_layers} layers")
        entries[name] = e
    missing = sorted(set(shapes) - set(entries))
    if missing:
        raise ConvertError(f"{path}: missing tensors {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    for name, shape in shapes.items():
        if tuple(reversed(entries[name].ne)) != shape:
            raise ConvertError(f"{path}: tensor {entries[name].name} has shape "
                               f"{tuple(reversed(entries[name].ne))}, the config needs {shape}")
    weights = {}
    with open(path, "rb") as f:  # read, not mapped: an error leaves no exported view of a map behind
        for name in shapes:
            f.seek(entries[name].begin)
            weights[name] = dequantize_tensor(np.frombuffer(f.read(entries[name].nbytes), np.uint8), entries[name])
    return config, weights
