"""ggml_top_k on every device this build has, through tfm_test_op (op_harness.run_op("top_k")).

The CUDA build of patch 0007 takes a one-pass kernel for k <= 32 (ggml-cuda/top-k.cu) and the
sort-based path above that; the drafter's backend top-k (tfm-ext topk_build) runs on it. On the
CPU the op is upstream's (std::partial_sort, unordered result): there these tests check the harness
and the semantics the GPU kernel must share. CUDA results: docs/gpu.md.
"""
from __future__ import annotations

import numpy as np
import pytest

from tfm_local.testing import op_harness
from tfm_local.testing import gdn_ops as tree_ops

DEVICES = tree_ops.available_devices() or ["cpu"]
POISON = np.array([np.nan], np.float32).view(np.int32)[0]
SMALL_K_MAX = 32  # patch 0007: the one-pass CUDA kernel's largest k


@pytest.fixture(autouse=True)
def _needs_harness():
    try:
        op_harness.lib()
    except op_harness.NativeError as e:
        pytest.skip(f"patched llama.cpp not built: {e}")


def top_k(x: np.ndarray, k: int, device: str) -> np.ndarray:
    """int32 (rows, k) column ids of ggml_top_k over float32 x (rows, n)."""
    out = op_harness.run_op("top_k", [np.ascontiguousarray(x, np.float32)], x.shape[0] * k, iparam=k, device=device)
    return out.view(np.int32).reshape(x.shape[0], k)


def assert_is_top_k(x: np.ndarray, ids: np.ndarray, k: int) -> None:
    """Each row of ids: k distinct in-range columns whose values are the row's k largest."""
    assert not np.any(ids == POISON), "unwritten output"
    n = x.shape[1]
    for r in range(x.shape[0]):
        assert np.all((ids[r] >= 0) & (ids[r] < n)), ids[r]
        assert len(set(ids[r].tolist())) == k
        want = np.sort(x[r])[::-1][:k]
        np.testing.assert_array_equal(np.sort(x[r, ids[r]])[::-1], want)


def gpu_small(device: str, k: int) -> bool:
    return device == "gpu" and k <= SMALL_K_MAX


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,n,k", [
    (1, 151_936, 8),      # one drafter row (Qwen2.5 vocabulary), as topk_build submits it
    (15, 151_936, 8),     # a whole block at once
    (3, 1_000, 1),        # one block of the kernel, k = 1
    (4, 151_936, 1),      # k = 1 over a vocabulary
    (4, 5_000, 16),       # two blocks per row, K = 16
    (2, 3 * 4096 + 5, 9), # uneven blocks (4 of 3074, 3074, 3074, 3071 columns), K = 16
    (2, 40_000, 32),      # the largest small k
    (2, 300, 40),         # above it: the sort path on CUDA
    (5, 7, 7),            # k = n
])
def test_top_k_returns_the_k_largest(device, rows, n, k):
    x = np.random.default_rng(rows * 7919 + n + k).standard_normal((rows, n)).astype(np.float32)
    ids = top_k(x, k, device)
    assert_is_top_k(x, ids, k)
    if gpu_small(device, k):  # the one-pass kernel returns them best first
        assert np.all(np.diff(x[np.arange(rows)[:, None], ids], axis=1) <= 0)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_and_infinities(device):
    n, k = 20_000, 4
    rng = np.random.default_rng(5)
    x = np.full((3, n), -np.inf, np.float32)
    x[0] = rng.standard_normal(n)
    tied = np.sort(rng.choice(n, 10, replace=False))
    x[0, tied] = 9.0                      # 10 equal maxima, k = 4
    x[2, rng.choice(n, 2, replace=False)] = 1.0  # 2 finite values, the rest -inf
    ids = top_k(x, k, device)
    assert_is_top_k(x, ids, k)
    if gpu_small(device, k):  # ties go to the lower column
        np.testing.assert_array_equal(ids[0], tied[:k])
        np.testing.assert_array_equal(ids[1], np.arange(k))


@pytest.mark.gpu
def test_nan_never_beats_a_number_on_the_gpu():
    x = np.random.default_rng(9).standard_normal((2, 50_000)).astype(np.float32)
    x[:, ::3] = np.nan
    ids = top_k(x, 8, "gpu")
    assert not np.any(np.isnan(x[np.arange(2)[:, None], ids]))
    finite = np.where(np.isnan(x), -np.inf, x)
    assert_is_top_k(finite, ids, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_k_is_refused(device):
    x = np.zeros((1, 10), np.float32)
    for k in (0, 11):
        with pytest.raises(ValueError):
            op_harness.run_op("top_k", [x], max(k, 1), iparam=k, device=device)


def argmax(x: np.ndarray, device: str) -> np.ndarray:
    """int32 (rows,) column ids of ggml_argmax over float32 x (rows, n)."""
    out = op_harness.run_op("argmax", [np.ascontiguousarray(x, np.float32)], x.shape[0], device=device)
    return out.view(np.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [100, 151_936])  # 151,936: CUDA takes patch 0007's kernel (rows >= 8,192)
def test_argmax_returns_the_largest_and_a_fixed_one_of_ties(device, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((5, n)).astype(np.float32)
    x[1, [n - 1, 7, n // 2]] = 50.0   # tied maxima
    x[2, :] = 0.0                     # all tied
    x[3, n - 1] = 50.0
    x[4, :] = -np.inf
    got = argmax(x, device)
    assert not np.any(got == POISON)
    first, last = np.argmax(x, axis=1), n - 1 - np.argmax(x[:, ::-1], axis=1)
    np.testing.assert_array_equal(got[[0, 3]], first[[0, 3]])
    if device == "cpu":  # upstream's CPU kernel (ggml_vec_argmax_f32) keeps the last of tied maxima
        np.testing.assert_array_equal(got[[1, 2, 4]], last[[1, 2, 4]])
    elif n >= 8192:      # patch 0007's: the first, as np.argmax (upstream's CUDA kernel promises no order)
        np.testing.assert_array_equal(got[[1, 2, 4]], first[[1, 2, 4]])
