"""Write a DFlash drafter GGUF that llama.cpp's ``dflash`` architecture loads.

Metadata: Qwen3 block hyper-parameters under ``dflash.*``, the DFlash keys
``dflash.target_layers`` (layer-input indices = HF ``target_layer_ids`` + 1,
int32 array) and ``dflash.block_size``, and the target's whole tokenizer
(copied from the target GGUF) plus ``tokenizer.ggml.mask_token_id``.
Tensors: ``fc``, ``enc.output_norm``, ``output_norm`` and ``blk.N.*``; no
``token_embd``/``output``: llama.cpp takes them from the target context
(``ctx_other``) at run time. A DFlash2 drafter adds ``dflash.conv_kernel_size``,
``dflash.conv_group_size``, ``dflash.selector_rank`` and ``dflash.selector_top_k``, its convolution
and selector tensors (``tfm_local.files.dflash``), and keeps its base kernels F32. Key and tensor
names follow upstream llama.cpp (``src/llama-arch.cpp``, ``src/models/dflash.cpp``).
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import gguf

from tfm_local.files.atomic import atomic_output
from tfm_local.files.dflash import SHARED_NAMES, DFlashConfig, expected_shapes, gguf_name, keeps_f32

from .errors import ConvertError, convert_errors
from .quant import FILE_TYPES, OUTTYPES, encode, encoded_nbytes, outtype_of, tensor_type
from .target_info import MASK_TOKEN_KEY, TargetInfo

ARCH = "dflash"
QT = gguf.GGMLQuantizationType
#: DFlash2's metadata keys after ``dflash.``: the ``DFlashConfig`` fields of the same names
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@convert_errors()
def write_drafter_gguf(out: str | os.PathLike, config: DFlashConfig, tensors: Mapping[str, Any],
                       target: TargetInfo, outtype: str = "f16", name: str | None = None,
                       tensor_types: Sequence[tuple[str, str]] = ()) -> Path:
    """Write the drafter GGUF; the file appears only when complete.

    Args:
        out: destination path.
        config: validated drafter config (see ``validate``).
        tensors: HF tensor name (no ``model.`` prefix) → object with ``shape``
            and ``load() -> float32 ndarray`` (a ``LazyTensor``) or an ndarray;
            the names must be exactly ``tfm_local.files.dflash.expected_shapes`` (plus
            optional shared copies, which are dropped).
        target: the target's facts; its tokenizer is copied.
        outtype: a name of ``quant.OUTTYPES`` (norms and DFlash2's base kernels stay F32; block types
            fall back to F16 for rows not a multiple of their block).
        name: ``general.name`` (default: the output file stem).
        tensor_types: ``(regex, outtype)`` pairs (``quant.parse_tensor_types``): a tensor whose GGUF
            name contains a regex's match gets the first such pair's type instead of ``outtype``.

    Returns:
        the output Path.

    Raises:
        ValueError: unknown outtype. OSError: the destination cannot be written.
    """
    for t in [outtype] + [t for _, t in tensor_types]:
        if t not in OUTTYPES:
            raise ValueError(f"outtype must be one of {sorted(OUTTYPES)}, got {t!r}")
    order = [n for n in expected_shapes(config.dims) if n not in SHARED_NAMES]
    names = [gguf_name(n) for n in order]
    unmatched = [p for p, _ in tensor_types if not any(re.search(p, g) for g in names)]
    if unmatched:
        raise ConvertError(f"--tensor-type {unmatched[0]!r} matches no tensor of this drafter "
                           f"(names like {names[0]!r}, {names[-1]!r})")
    out = Path(out)
    with atomic_output(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), ARCH)
        try:
            add_metadata(w, config, target, outtype, name or out.stem)
            plan = [(n, tuple(tensors[n].shape),
                     QT.F32 if keeps_f32(n) else
                     tensor_type(tuple(tensors[n].shape), outtype_of(gguf_name(n), outtype, tensor_types)))
                    for n in order]
            _note_fallbacks(plan, outtype, tensor_types)
            for n, shape, qt in plan:
                _add_info(w, gguf_name(n), shape, qt)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for n, _, qt in plan:
                w.write_tensor_data(encode(_fits(_load(tensors[n], n), qt, _where(tensors[n], n)), qt))
        finally:
            w.close()
    return out


def add_metadata(w: gguf.GGUFWriter, config: DFlashConfig, target: TargetInfo, outtype: str, name: str) -> None:
    """Add general, hyper-parameter, DFlash and tokenizer keys to ``w``."""
    w.add_name(name)
    w.add_file_type(FILE_TYPES[outtype])
    if OUTTYPES[outtype] == QT.Q8_0:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(config.max_position_embeddings or target.n_ctx_train or 4096)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    if config.hidden_act != "silu":
        w.add_string(f"{ARCH}.hidden_activation", config.hidden_act)
    w.add_key_value(f"{ARCH}.target_layers", [i + 1 for i in config.target_layer_ids],
                    gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    w.add_uint32(f"{ARCH}.block_size", config.block_size)
    if config.dflash2:
        for key in DFLASH2_KEYS:
            w.add_uint32(f"{ARCH}.{key}", getattr(config, key))
    for kv in target.tokenizer:
        w.add_key_value(kv.key, kv.value, kv.vtype, kv.sub_type)
    w.add_uint32(MASK_TOKEN_KEY, config.mask_token_id)


def _add_info(w: gguf.GGUFWriter, name: str, shape: tuple[int, ...], qt: QT) -> None:
    """Declare a tensor of element ``shape`` stored as ``qt`` (data written later)."""
    if qt in (QT.F32, QT.F16):
        w.add_tensor_info(name, shape, np.dtype(np.float32 if qt == QT.F32 else np.float16), encoded_nbytes(shape, qt))
    else:
        w.add_tensor_info(name, shape, np.dtype(np.float32), encoded_nbytes(shape, qt), raw_dtype=qt)


def _note_fallbacks(plan, outtype: str, tensor_types) -> None:
    """Say on stderr which matrices could not take their block type (rows not a multiple of its block)."""
    fell = [gguf_name(n) for n, shape, qt in plan
            if len(shape) > 1 and qt == QT.F16 and OUTTYPES[outtype_of(gguf_name(n), outtype, tensor_types)] != QT.F16]
    if fell:
        print(f"note: {len(fell)} matrices stay F16, their rows not a multiple of the type's block "
              f"(e.g. {fell[0]})", file=sys.stderr)


#: the largest magnitude a float16 holds: the F16 type's values and the block types' scales
F16_MAX = 65504.0


def _where(t: Any, name: str) -> str:
    """How an error names tensor ``name`` of ``t``: with its file when it comes from one (a LazyTensor:
    found by fuzzing, a message that named the tensor only)."""
    return f"{t.file}: tensor {t.name!r}" if hasattr(t, "file") else f"tensor {name!r}"


def _fits(a: np.ndarray, qt: QT, where: str) -> np.ndarray:
    """``a`` when its values survive type ``qt``; ConvertError when a value beyond the float16 range
    would become infinite in an F16 tensor or a block type's float16 scale (F32 and BF16 hold them).
    ``where`` names the tensor (``_where``)."""
    if qt in (QT.F32, QT.BF16) or not a.size:
        return a
    largest = float(np.max(np.abs(a)))
    if largest >= F16_MAX:
        raise ConvertError(f"{where} holds values beyond the float16 range (±{F16_MAX:g}, largest "
                           f"{largest:.3g}), which its type {qt.name} cannot store: "
                           "convert it with --outtype f32 or bf16, or check the checkpoint")
    return a


def _load(t: Any, name: str) -> np.ndarray:
    """float32 data of a LazyTensor-like object or an array; ConvertError when any value is not finite
    (damaged weights: a drafter of NaNs drafts nothing, and quantizing them hides where they came from)."""
    a = t.load() if hasattr(t, "load") else np.asarray(t, dtype=np.float32)
    bad = a.size - int(np.count_nonzero(np.isfinite(a)))
    if bad:
        raise ConvertError(f"{_where(t, name)} holds {bad} values that are not finite (NaN or infinity)")
    return a
