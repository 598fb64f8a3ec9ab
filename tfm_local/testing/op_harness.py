"""cffi bindings (ABI mode) for the op test/bench harness (``ggml_ops/src/tfm-op-harness.h``): run
(:func:`run_op`) or time (:func:`bench_op`) one ggml op of the installed library on host arrays, on the
CPU or the first GPU. For the tests and the benchmarks (``tfm_local.bench.gdn``) only: the runtime never
imports it. The harness is covered by tfm-ext.h's ``tfm_api_version`` (:data:`tfm_local.llama.native.API_VERSION`,
checked at load); the library is opened as :mod:`tfm_local.llama.native` opens it.
"""
from __future__ import annotations

import functools

import numpy as np

from ..llama.native import API_VERSION, NativeError, open_library

_CDEF = """
int32_t tfm_api_version(void);
void tfm_test_op_set_fparams(const float * p, int32_t n);
int32_t tfm_test_op(int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                    const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                    float * out, int64_t out_n);
int32_t tfm_bench_op(int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                     const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                     int32_t n_repeat, int32_t n_warmup, int32_t n_iter, float * ms_out);
"""


@functools.lru_cache(maxsize=1)
def lib():
    """Return ``(ffi, lib)`` for the patched libllama's op harness; raises NativeError when unusable."""
    return open_library(_CDEF, "tfm_api_version", API_VERSION)


# op ids of tfm_test_op (tfm-op-harness.h)
TEST_OPS = {"gdn": 0, "gdn_tree": 1, "gdn_commit": 2, "conv": 3, "conv_tree": 4, "conv_commit": 5, "top_k": 6, "argmax": 7,
            "sample_tokens": 8}


def set_op_fparams(*params: float) -> None:
    """The float parameters of the next ``run_op`` / ``bench_op`` calls of ops that take some
    (``sample_tokens``: temp, top_p, min_p; its top_k is ``iparam``)."""
    ffi, h = lib()
    h.tfm_test_op_set_fparams(ffi.new("float[]", [float(p) for p in params]), len(params))


class OpUnavailable(NativeError):
    """The requested device is absent, or it does not support the op with these shapes."""


def _op_args(ffi, op: str, srcs, device: str):
    """The C arguments shared by tfm_test_op and tfm_bench_op: (op id, keep-alive arrays, src pointers,
    ne, types, device id). Raises ValueError on an unknown op or device or a bad source array."""
    if op not in TEST_OPS:
        raise ValueError(f"op must be one of {sorted(TEST_OPS)}, got {op!r}")
    dev = {"cpu": 0, "gpu": 1}.get(device)
    if dev is None:
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    arrays, ne, types = [], [], []
    for a in srcs:
        a = np.asarray(a)
        if a.dtype not in (np.float32, np.int32) or a.ndim > 4:
            raise ValueError(f"test_op sources must be float32/int32 with <= 4 dims, got {a.dtype} {a.shape}")
        arrays.append(np.ascontiguousarray(a))
        ne += list(a.shape[::-1]) + [1] * (4 - a.ndim)
        types.append(0 if a.dtype == np.float32 else 1)
    if not arrays:
        raise ValueError("test_op needs at least one source array")
    ptrs = ffi.new("void *[]", [ffi.from_buffer(a) for a in arrays])
    return TEST_OPS[op], arrays, ptrs, ffi.new("int64_t[]", ne), ffi.new("int32_t[]", types), dev


def _check_rc(rc: int, op: str, device: str, what: str) -> None:
    if rc == -2:
        raise OpUnavailable(f"no {device} device in this build")
    if rc == -3:
        raise OpUnavailable(f"the {device} device does not support {op} with these shapes")
    if rc != 0:
        raise ValueError(f"{what}({op}) failed: bad arguments (source count or shapes for the op)")


def run_op(op: str, srcs, out_size: int, iparam: int = 0, device: str = "cpu", n_threads: int = 2) -> np.ndarray:
    """Run one ggml op (``TEST_OPS``) on host arrays through ``tfm_test_op``; returns float32 ``[out_size]``.

    ``srcs`` are numpy arrays in the op's argument order (see tfm-op-harness.h), float32 or int32,
    of at most 4 dimensions; numpy shape ``(d3, d2, d1, d0)`` is ggml's ``ne = [d0, d1, d2, d3]``.
    ``out_size`` must be the result's element count. The result tensor is NaN-filled before the
    run. ``device``: ``"cpu"`` (``n_threads`` threads) or ``"gpu"`` (the first GPU device).
    Raises OpUnavailable when the device is absent or cannot run the op, ValueError on bad arguments
    (also a wrong ``out_size``). An op with an int32 result (``top_k``, ``argmax``) comes back bit for bit in the
    float32 array: read it with ``.view(np.int32)`` (an unwritten element then reads 0x7FC00000).
    """
    ffi, h = lib()
    op_id, arrays, ptrs, ne, types, dev = _op_args(ffi, op, srcs, device)
    out = np.full(out_size, np.nan, dtype=np.float32)
    rc = h.tfm_test_op(op_id, len(arrays), ptrs, ne, types, int(iparam), dev, int(n_threads),
                       ffi.from_buffer("float[]", out), out_size)
    _check_rc(rc, op, device, f"tfm_test_op (output size {out_size})")
    return out


BENCH_MAX_REPEAT = 64  # TFM_BENCH_MAX_REPEAT of tfm-op-harness.h


def op_time(ms_1: np.ndarray, ms_r: np.ndarray, n_repeat: int) -> float:
    """The op's own time in ms, without the per-computation launch + synchronize: the difference of the
    median wall times of a graph of ``n_repeat`` copies (``ms_r``) and of one copy (``ms_1``), per extra
    copy (:func:`bench_op` with ``n_repeat`` and 1). Raises ValueError for ``n_repeat`` < 2."""
    if n_repeat < 2:
        raise ValueError(f"op_time needs n_repeat >= 2, got {n_repeat}")
    return float((np.median(ms_r) - np.median(ms_1)) / (n_repeat - 1))


def bench_op(op: str, srcs, iparam: int = 0, device: str = "cpu", n_threads: int = 2,
             n_warmup: int = 3, n_iter: int = 10, n_repeat: int = 1) -> np.ndarray:
    """Time one ggml op (``TEST_OPS``) through ``tfm_bench_op``: float32 ``[n_iter]`` wall times in ms.

    Sources, ``iparam``, ``device`` and ``n_threads`` as :func:`run_op`. The sources are uploaded
    once; a graph of ``n_repeat`` independent copies of the op over them (1..BENCH_MAX_REPEAT) is
    then computed ``n_warmup`` times untimed and ``n_iter`` times timed, each computation followed
    by a backend synchronize (a time covers compute + synchronize of all copies, not the upload).
    Nothing is copied back. :func:`op_time` turns two repeat counts into the op's own time.
    Raises ValueError for ``n_warmup`` < 0, ``n_iter`` < 1, ``n_repeat`` outside 1..BENCH_MAX_REPEAT
    or bad sources, OpUnavailable as :func:`run_op`.
    """
    if int(n_warmup) < 0 or int(n_iter) < 1 or not 1 <= int(n_repeat) <= BENCH_MAX_REPEAT:
        raise ValueError(f"bench_op needs n_warmup >= 0, n_iter >= 1 and n_repeat in 1..{BENCH_MAX_REPEAT}, "
                         f"got {n_warmup}, {n_iter}, {n_repeat}")
    ffi, h = lib()
    op_id, arrays, ptrs, ne, types, dev = _op_args(ffi, op, srcs, device)
    ms = np.full(int(n_iter), np.nan, dtype=np.float32)
    rc = h.tfm_bench_op(op_id, len(arrays), ptrs, ne, types, int(iparam), dev, int(n_threads),
                        int(n_repeat), int(n_warmup), int(n_iter), ffi.from_buffer("float[]", ms))
    _check_rc(rc, op, device, "tfm_bench_op")
    return ms
