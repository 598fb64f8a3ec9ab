"""The CPU small-batch products (patch 0015, ggml-cpu/smallbatch.c), driven through cffi on random
weights and activations: every row of an n-row product (n = 1..16) has the bits of ggml's 1-row
product of the same pair (the type's vec_dot; the GEMV of the repacked Q4_K layout), for the SIMD
kernels and the pair-by-pair kernel of builds without SIMD kernels, and the results match a float64
dot product of the dequantized operands."""
from __future__ import annotations

import functools

import cffi
import numpy as np
import pytest

_CDEF = """
typedef void (*from_float_t)(const float * x, void * y, int64_t k);
typedef void (*to_float_t)(const void * x, float * y, int64_t k);
typedef void (*vec_dot_t)(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc);
typedef void (*gemv_t)(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
struct ggml_type_traits_cpu { from_float_t from_float; vec_dot_t vec_dot; int vec_dot_type; int64_t nrows; };
struct ggml_type_traits { const char * type_name; int64_t blck_size; int64_t blck_size_interleave;
                          size_t type_size; bool is_quantized; to_float_t to_float; from_float_t from_float_ref; };
const struct ggml_type_traits_cpu * ggml_get_type_traits_cpu(int type);
const struct ggml_type_traits * ggml_get_type_traits(int type);
void ggml_cpu_init(void);
size_t ggml_row_size(int type, int64_t ne);
size_t ggml_quantize_chunk(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                           int64_t n_per_row, const float * imatrix);
bool ggml_cpu_smallbatch_has(int type);
bool ggml_cpu_smallbatch_has_x8(int type);
void ggml_cpu_smallbatch(int type, int n, float * s, size_t bs, const void * vx, size_t bx, int nr,
                         const void * vy, size_t by, int nc);
void ggml_cpu_smallbatch_ref(int type, int n, float * s, size_t bs, const void * vx, size_t bx, int nr,
                             const void * vy, size_t by, int nc);
void ggml_cpu_smallbatch_x8(int type, int n, float * s, size_t bs, const void * vx, int nr,
                            const void * vy, size_t by, int nc);
void ggml_gemv_q4_K_8x8_q8_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
"""

F32, Q4_0, Q8_0, Q4_K, Q6_K, Q8_K = 0, 2, 8, 12, 14, 15
NAMES = {F32: "f32", Q4_0: "q4_0", Q8_0: "q8_0", Q4_K: "q4_K", Q6_K: "q6_K"}
MAX_COLS = 16
N_ROWS = 24


@functools.lru_cache(maxsize=1)
def ggml():
    """(ffi, libggml-cpu, libggml-base) of the installed patched build."""
    import llama_cpp  # noqa: F401  (loads the ggml libraries into the process)

    ffi = cffi.FFI()
    ffi.cdef(_CDEF)
    cpu = ffi.dlopen("libggml-cpu.so.0")
    base = ffi.dlopen("libggml-base.so.0")
    cpu.ggml_cpu_init()
    return ffi, cpu, base


def _buf(ffi, nbytes: int):
    return ffi.new("char[]", max(int(nbytes), 1))


def _operands(wtype: int, k: int, seed: int):
    """Random weights (N_ROWS x k, quantized to wtype) and MAX_COLS activation rows quantized to the
    type's vec_dot_type; returns (w, bx, a, by, vec_dot_type)."""
    ffi, cpu, base = ggml()
    rng = np.random.default_rng(seed)
    wf = rng.standard_normal((N_ROWS, k)).astype(np.float32)
    af = rng.standard_normal((MAX_COLS, k)).astype(np.float32)
    af[:, ::7] *= 6.0  # outliers, so block scales differ within a row
    vt = cpu.ggml_get_type_traits_cpu(wtype).vec_dot_type
    bx, by = base.ggml_row_size(wtype, k), base.ggml_row_size(vt, k)
    w, a = _buf(ffi, bx * N_ROWS), _buf(ffi, by * MAX_COLS)
    if wtype == F32:
        ffi.memmove(w, wf.tobytes(), bx * N_ROWS)
    else:
        base.ggml_quantize_chunk(wtype, ffi.from_buffer("float[]", wf), w, 0, N_ROWS, k, ffi.NULL)
    from_float = cpu.ggml_get_type_traits_cpu(vt).from_float
    for c in range(MAX_COLS):
        from_float(ffi.from_buffer("float[]", af[c]), a + c * by, k)
    return w, bx, a, by, vt


def _dequant(t: int, buf, nrows: int, row_bytes: int, k: int) -> np.ndarray:
    ffi, _, base = ggml()
    out = np.zeros((nrows, k), np.float32)
    raw = np.frombuffer(ffi.buffer(buf, nrows * row_bytes), np.uint8).reshape(nrows, row_bytes)
    if t == F32:
        return raw.view(np.float32).copy()
    if t == Q8_K:  # blocks of float d, int8 qs[256], int16 bsums[16] (ggml has no to_float for it)
        blocks = raw.reshape(nrows, k // 256, 292)
        d = blocks[:, :, :4].copy().view(np.float32)
        return (d * blocks[:, :, 4:260].view(np.int8)).reshape(nrows, k)
    to_float = base.ggml_get_type_traits(t).to_float
    for r in range(nrows):
        to_float(buf + r * row_bytes, ffi.from_buffer("float[]", out[r]), k)
    return out


def _one_row(vec_dot, k, w, bx, a, by) -> np.ndarray:
    """[col, row] products of ggml's 1-row kernel."""
    ffi = ggml()[0]
    out = np.zeros((MAX_COLS, N_ROWS), np.float32)
    s = ffi.new("float *")
    for c in range(MAX_COLS):
        for r in range(N_ROWS):
            vec_dot(k, s, 0, w + r * bx, 0, a + c * by, 0, 1)
            out[c, r] = s[0]
    return out


def _many(fn, wtype, k, w, bx, a, by, nc) -> np.ndarray:
    ffi = ggml()[0]
    out = np.full((nc, N_ROWS), np.nan, np.float32)
    fn(wtype, k, ffi.from_buffer("float[]", out), N_ROWS, w, bx, N_ROWS, a, by, nc)
    return out


def _check_rows(want: np.ndarray, fn, wtype, k, w, bx, a, by):
    for nc in range(1, MAX_COLS + 1):
        got = _many(fn, wtype, k, w, bx, a, by, nc)
        bad = np.argwhere(got.view(np.uint32) != want[:nc].view(np.uint32))
        assert bad.size == 0, (f"{NAMES[wtype]} k={k} n={nc}: {len(bad)} products differ from the 1-row "
                               f"kernel, first (col, row) {tuple(bad[0])}: {got[tuple(bad[0])]!r} vs "
                               f"{want[tuple(bad[0])]!r}")


def _check_float(want: np.ndarray, wtype, vt, k, w, bx, a, by):
    """Products within float rounding of a float64 dot of the dequantized weights and activations."""
    wd = _dequant(wtype, w, N_ROWS, bx, k).astype(np.float64)
    ad = _dequant(vt, a, MAX_COLS, by, k).astype(np.float64)
    exact = ad @ wd.T
    scale = np.abs(ad) @ np.abs(wd).T
    err = np.abs(want - exact)
    assert np.all(err <= 1e-5 * scale + 1e-6), f"{NAMES[wtype]} k={k}: max error / scale {np.max(err / scale):.3g}"


SHAPES = [(Q4_K, 256), (Q4_K, 1536), (Q4_K, 2304), (Q6_K, 256), (Q6_K, 1536), (Q6_K, 8960),
          (Q8_0, 96), (Q8_0, 1536), (Q8_0, 992), (Q4_0, 32), (Q4_0, 1536), (Q4_0, 800),
          (F32, 7), (F32, 100), (F32, 1536)]


@pytest.mark.parametrize("wtype,k", SHAPES, ids=[f"{NAMES[t]}-{k}" for t, k in SHAPES])
def test_rows_have_the_bits_of_the_one_row_product(wtype, k):
    _, cpu, _ = ggml()
    assert cpu.ggml_cpu_smallbatch_has(wtype), f"this build has no small-batch kernel for {NAMES[wtype]}"
    w, bx, a, by, vt = _operands(wtype, k, seed=k + 31 * wtype)
    want = _one_row(cpu.ggml_get_type_traits_cpu(wtype).vec_dot, k, w, bx, a, by)
    _check_rows(want, cpu.ggml_cpu_smallbatch, wtype, k, w, bx, a, by)
    _check_float(want, wtype, vt, k, w, bx, a, by)


@pytest.mark.parametrize("wtype,k", SHAPES, ids=[f"{NAMES[t]}-{k}" for t, k in SHAPES])
def test_pair_by_pair_kernel_has_the_bits_of_the_one_row_product(wtype, k):
    """ggml_cpu_smallbatch_ref, the live kernel of builds without SIMD kernels: strides, columns and
    rows laid out as ggml_cpu_smallbatch's, each product the type's vec_dot."""
    _, cpu, _ = ggml()
    w, bx, a, by, vt = _operands(wtype, k, seed=7 * k + wtype)
    want = _one_row(cpu.ggml_get_type_traits_cpu(wtype).vec_dot, k, w, bx, a, by)
    _check_rows(want, cpu.ggml_cpu_smallbatch_ref, wtype, k, w, bx, a, by)
    _check_float(want, wtype, vt, k, w, bx, a, by)


def _pack_q4_K_x8(q: np.ndarray) -> np.ndarray:
    """ggml's 8-row interleaved Q4_K layout (block_q4_Kx8) of 8 rows of block_q4_K bytes [8, nb, 144]:
    per block, 8 d, 8 dmin (fp16), then per sub-block j 12 bytes with the 8 rows' 6-bit scale and min of
    sub-block j, then the rows' quants 8 bytes at a time."""
    rows, nb, _ = q.shape
    assert rows == 8
    out = np.zeros((nb, 1152), np.uint8)
    d, dmin, sc12, qs = q[:, :, 0:2], q[:, :, 2:4], q[:, :, 4:16].astype(np.int32), q[:, :, 16:144]
    # the 8 (scale, min) of each row's sub-blocks
    s = np.zeros((8, nb, 8), np.int32)
    m = np.zeros((8, nb, 8), np.int32)
    s[:, :, :4] = sc12[:, :, 0:4] & 63
    m[:, :, :4] = sc12[:, :, 4:8] & 63
    s[:, :, 4:] = (sc12[:, :, 8:12] & 0xF) | ((sc12[:, :, 0:4] >> 6) << 4)
    m[:, :, 4:] = (sc12[:, :, 8:12] >> 4) | ((sc12[:, :, 4:8] >> 6) << 4)
    for b in range(nb):
        out[b, 0:16] = d[:, b].reshape(-1)
        out[b, 16:32] = dmin[:, b].reshape(-1)
        for j in range(8):
            sj, mj = s[:, b, j], m[:, b, j]  # 8 rows: encode as a q4_K scales field whose "sub-blocks" are rows
            g = np.zeros(12, np.int32)
            g[0:4] = (sj[:4] & 63) | ((sj[4:] >> 4) << 6)
            g[4:8] = (mj[:4] & 63) | ((mj[4:] >> 4) << 6)
            g[8:12] = (sj[4:] & 15) | ((mj[4:] & 15) << 4)
            out[b, 32 + 12 * j:44 + 12 * j] = g.astype(np.uint8)
        out[b, 128:] = qs[:, b].reshape(8, 16, 8).transpose(1, 0, 2).reshape(-1)
    return out


@pytest.mark.parametrize("k", [256, 1536, 8960])
def test_repacked_q4_K_rows_have_the_bits_of_the_gemv(k):
    ffi, cpu, _ = ggml()
    if not cpu.ggml_cpu_smallbatch_has_x8(Q4_K):
        pytest.skip("this build has no repacked Q4_K kernel (x86 with AVX2 only)")
    w, bx, a, by, vt = _operands(Q4_K, k, seed=k)
    nb = k // 256
    plain = np.frombuffer(ffi.buffer(w, bx * N_ROWS), np.uint8).reshape(N_ROWS, nb, 144)
    packed = np.concatenate([_pack_q4_K_x8(plain[g:g + 8]) for g in range(0, N_ROWS, 8)])
    px = ffi.from_buffer("char[]", packed)
    gemv = cpu.ggml_gemv_q4_K_8x8_q8_K
    want = np.zeros((MAX_COLS, N_ROWS), np.float32)
    for c in range(MAX_COLS):
        gemv(k, ffi.from_buffer("float[]", want[c]), 0, px, a + c * by, 1, N_ROWS)
    for nc in range(1, MAX_COLS + 1):
        got = np.full((nc, N_ROWS), np.nan, np.float32)
        cpu.ggml_cpu_smallbatch_x8(Q4_K, k, ffi.from_buffer("float[]", got), N_ROWS, px, N_ROWS, a, by, nc)
        bad = np.argwhere(got.view(np.uint32) != want[:nc].view(np.uint32))
        assert bad.size == 0, f"k={k} n={nc}: {len(bad)} products differ from the GEMV, first {tuple(bad[0])}"
    _check_float(want, Q4_K, vt, k, w, bx, a, by)
