"""Output tensor types of the drafter GGUF.

Rules: 1-D tensors (norm weights) stay F32; F16/BF16 apply to every matrix;
the block types Q8_0, Q5_0 and Q4_0 (blocks of 32 values with one f16 scale;
8.5, 5.5 and 4.5 bits per value) apply to matrices whose row length is a
multiple of 32, the others fall back to F16. Q5_0/Q4_0 let a deeper drafter
fit a size limit (a 3-layer drafter of the 1.5B target: ~36 MB in Q4_0).
Quantisation is done by the ``gguf`` package (``gguf.quants``).
"""
from __future__ import annotations

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

#: --outtype name → GGML type.
OUTTYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q5_0": QT.Q5_0, "q4_0": QT.Q4_0}

#: --outtype name → general.file_type.
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
              "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
              "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}

#: types quantised in blocks along the rows (the row length must be a multiple of the block)
BLOCK_TYPES = (QT.Q8_0, QT.Q5_0, QT.Q4_0)


def tensor_type(shape: tuple[int, ...], outtype: str) -> QT:
    """GGML type of a tensor of ``shape`` (numpy order) for ``outtype``.

    Raises:
        KeyError: unknown outtype.
    """
    qt = OUTTYPES[outtype]
    if len(shape) < 2:
        return QT.F32
    if qt in BLOCK_TYPES and shape[-1] % gguf.GGML_QUANT_SIZES[qt][0]:
        return QT.F16
    return qt


def encoded_nbytes(shape: tuple[int, ...], qt: QT) -> int:
    """Bytes of a tensor of ``shape`` stored as ``qt``."""
    return int(np.prod(gguf.quant_shape_to_byte_shape(shape, qt), dtype=np.int64))


def encode(a: np.ndarray, qt: QT) -> np.ndarray:
    """Encode a float32 array as ``qt``: float32/float16 arrays, or uint8 bytes for BF16 and block types."""
    return gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), qt)
