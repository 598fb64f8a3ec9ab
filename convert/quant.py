"""Output tensor types of the drafter GGUF.

Rules: 1-D tensors (norm weights) stay F32; F16/BF16 apply to every matrix;
the block types Q8_0, Q5_0 and Q4_0 (blocks of 32 values with one f16 scale;
8.5, 5.5 and 4.5 bits per value), IQ4_NL (blocks of 32, 4.5 bits, a non-linear
grid) and the K-quants Q2_K … Q6_K (super-blocks of 256 values with
sub-block scales; 2.63, 3.44, 4.5, 5.5 and 6.56 bits) apply to matrices whose row length is a multiple of the
block, the others fall back to F16. Q5_0 and the 4.5-bit types let a deeper
drafter fit a size limit (a 3-layer drafter of the 1.5B target: ~36 MB).
Quantisation is done by the ``gguf`` package (``gguf.quants``), the K-quants and IQ4_NL
by ggml's own quantiser (``ggml_quant``). ``tensor_types`` picks a type per tensor by name
(llama-quantize's ``--tensor-type``), e.g. a Q4_K file with its most sensitive matrices in Q6_K.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

from . import ggml_quant

#: --outtype name → GGML type.
OUTTYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q5_0": QT.Q5_0, "q4_0": QT.Q4_0,
            "q2_k": QT.Q2_K, "q3_k": QT.Q3_K, "q4_k": QT.Q4_K, "q5_k": QT.Q5_K, "q6_k": QT.Q6_K,
            "iq4_nl": QT.IQ4_NL}

#: --outtype name → general.file_type.
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
              "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
              "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
              "q2_k": gguf.LlamaFileType.MOSTLY_Q2_K, "q3_k": gguf.LlamaFileType.MOSTLY_Q3_K_S,
              "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_S, "q5_k": gguf.LlamaFileType.MOSTLY_Q5_K_S,
              "q6_k": gguf.LlamaFileType.MOSTLY_Q6_K, "iq4_nl": gguf.LlamaFileType.MOSTLY_IQ4_NL}

#: types quantised in blocks along the rows (the row length must be a multiple of the block)
BLOCK_TYPES = (QT.Q8_0, QT.Q5_0, QT.Q4_0) + ggml_quant.GGML_TYPES


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
    """Encode a float32 array as ``qt``: float32/float16 arrays, or uint8 bytes for BF16 and block types.

    Raises:
        ConvertError: a K-quant or IQ4_NL without llama-cpp-python's ggml (``ggml_quant``).
    """
    if qt in ggml_quant.GGML_TYPES:
        return ggml_quant.quantize(a, qt)
    return gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), qt)


def parse_tensor_types(specs: Sequence[str]) -> list[tuple[str, str]]:
    """``["REGEX=TYPE", ...]`` → ``[(regex, outtype), ...]`` (e.g. ``"ffn_down|fc=q6_k"``).

    Raises:
        ValueError: no ``=``, an invalid regular expression or an unknown type.
    """
    out = []
    for spec in specs:
        pattern, sep, outtype = spec.rpartition("=")
        if not sep or not pattern:
            raise ValueError(f"tensor type {spec!r} is not REGEX=TYPE")
        if outtype not in OUTTYPES:
            raise ValueError(f"tensor type {spec!r}: {outtype!r} is not one of {sorted(OUTTYPES)}")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"tensor type {spec!r}: bad regular expression ({e})") from None
        out.append((pattern, outtype))
    return out


def outtype_of(gguf_name: str, outtype: str, tensor_types: Sequence[tuple[str, str]] = ()) -> str:
    """The outtype of tensor ``gguf_name``: the first of ``tensor_types`` whose regex it contains, else ``outtype``."""
    return next((t for pattern, t in tensor_types if re.search(pattern, gguf_name)), outtype)
