"""Output tensor types of the drafter GGUF.

Rules: 1-D tensors (norm weights) stay F32; F16/BF16 apply to every matrix;
Q8_0 (blocks of 32 values with one f16 scale) applies to matrices whose row
length is a multiple of 32, the others fall back to F16.
Quantisation is done by the ``gguf`` package (``gguf.quants``).
"""
from __future__ import annotations

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

#: --outtype name → GGML type.
OUTTYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}

#: --outtype name → general.file_type.
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
              "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


def tensor_type(shape: tuple[int, ...], outtype: str) -> QT:
    """GGML type of a tensor of ``shape`` (numpy order) for ``outtype``.

    Raises:
        KeyError: unknown outtype.
    """
    qt = OUTTYPES[outtype]
    if len(shape) < 2:
        return QT.F32
    if qt == QT.Q8_0 and shape[-1] % gguf.GGML_QUANT_SIZES[QT.Q8_0][0]:
        return QT.F16
    return qt


def encoded_nbytes(shape: tuple[int, ...], qt: QT) -> int:
    """Bytes of a tensor of ``shape`` stored as ``qt``."""
    return int(np.prod(gguf.quant_shape_to_byte_shape(shape, qt), dtype=np.int64))


def encode(a: np.ndarray, qt: QT) -> np.ndarray:
    """Encode a float32 array as ``qt``: float32/float16 arrays, or uint8 bytes for BF16/Q8_0."""
    return gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), qt)
