"""Quantisation by ggml itself, for the types the ``gguf`` package cannot encode (K-quants, IQ4_NL).

``gguf.quants`` encodes Q8_0, Q5_0 and Q4_0 in numpy but only decodes the K-quants and IQ4_NL; llama.cpp's own
quantiser (``ggml_quantize_chunk`` in ggml/src/ggml.c, the function llama-quantize calls per tensor) is
exported by ``libggml-base``, which the llama-cpp-python build ships beside ``libllama``. It is bound
here through cffi (ABI mode) and opened by soname after ``llama_cpp`` has loaded the library, so the
process holds one copy of ggml (as ``tfm_local.llama.native`` does for ``libllama``).
"""
from __future__ import annotations

import functools

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

from .errors import ConvertError

#: types encoded by ggml here (the others by gguf.quants)
GGML_TYPES = (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL)

_CDEF = """
size_t ggml_quantize_chunk(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                           int64_t n_per_row, const float * imatrix);
size_t ggml_row_size(int type, int64_t ne);
"""


@functools.lru_cache(maxsize=1)
def _lib():
    """``(ffi, lib)`` for libggml-base; ConvertError when llama-cpp-python or the library is missing."""
    import cffi

    try:
        import llama_cpp  # noqa: F401  (loads libggml-base into the process first)
    except ImportError as e:
        raise ConvertError(f"K-quant and IQ4_NL output need llama-cpp-python (its ggml quantiser): {e}") from None
    ffi = cffi.FFI()
    ffi.cdef(_CDEF)
    try:
        return ffi, ffi.dlopen("libggml-base.so.0")
    except OSError as e:
        raise ConvertError(f"cannot open llama-cpp-python's libggml-base.so.0: {e}") from None


def quantize(a: np.ndarray, qt: QT) -> np.ndarray:
    """Encode ``a`` (float32, rows along the last axis) as ``qt`` with ggml's quantiser, no importance matrix.

    Returns:
        uint8 array of shape ``gguf.quant_shape_to_byte_shape(a.shape, qt)`` (the bytes llama.cpp reads).
    Raises:
        ValueError: ``qt`` not in ``GGML_TYPES``, or a row length that is not a multiple of its block
            (256 values for the K-quants, 32 for IQ4_NL).
        ConvertError: ggml's quantiser is not available.
    """
    if qt not in GGML_TYPES:
        raise ValueError(f"{qt.name} is not quantised by ggml here (types: {[t.name for t in GGML_TYPES]})")
    a = np.ascontiguousarray(a, dtype=np.float32)
    block = gguf.GGML_QUANT_SIZES[qt][0]
    if a.ndim == 0 or a.shape[-1] % block:
        raise ValueError(f"{qt.name} needs rows of a multiple of {block} values, got shape {a.shape}")
    ffi, lib = _lib()
    n_per_row = a.shape[-1]
    nrows = a.size // n_per_row
    out = np.empty(gguf.quant_shape_to_byte_shape(a.shape, qt), dtype=np.uint8)
    assert lib.ggml_row_size(int(qt), n_per_row) * nrows == out.nbytes
    wrote = lib.ggml_quantize_chunk(int(qt), ffi.from_buffer("float[]", a), ffi.from_buffer(out), 0, nrows,
                                    n_per_row, ffi.NULL)
    if wrote != out.nbytes:
        raise ConvertError(f"ggml_quantize_chunk wrote {wrote} bytes for {qt.name} {a.shape}, expected {out.nbytes}")
    return out
