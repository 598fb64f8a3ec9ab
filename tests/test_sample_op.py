"""ggml_sample_tokens (patch 0011): the draw in the graph against its host twin, and its distribution.

The op and ``sampling.sample_row`` implement one definition (ggml.h, sampling.kept_set): the same kept
set and the same keyed Gumbel noise, so on the same row and key they return the same token and the same
kept-set size, whatever the path the kernel takes (a threshold inside a small histogram bucket, inside
a bucket of thousands of tied logits, or inside the open-ended last bucket). The distribution tests
compare many draws (one key each) with ``target_probs``: chi-square at a false-alarm rate of 1e-4
per test. On a GPU build the CUDA kernel is compared with the CPU's as well.
"""
import numpy as np
import pytest
from scipy import stats

from tfm_local.decode.sampling import SamplingParams, draw_key, kept_set, sample_row, target_probs
from tfm_local.llama import native
from tfm_local.testing import op_harness

SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.95),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=1.3, top_k=5),
    dict(temperature=0.5, min_p=0.1),
    dict(temperature=2.0, top_p=0.5),
    dict(temperature=1.0, top_k=1),
    dict(temperature=0.9, top_p=0.99),
]


def op_draw(rows: np.ndarray, keys: list[int], sp: SamplingParams, device: str = "cpu",
            n_threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """The op on ``rows`` float32 ``[R, n_vocab]`` with one 64-bit key per row → (ids, kept) int32 ``[R]``.
    On the CPU with fewer rows than ``n_threads`` the kernel splits each row over the threads."""
    k = np.array([[key & 0xFFFFFFFF, key >> 32] for key in keys], dtype=np.uint32).view(np.int32)
    op_harness.set_op_fparams(sp.temperature, sp.top_p, sp.min_p)
    out = op_harness.run_op("sample_tokens", [np.ascontiguousarray(rows, np.float32), k], 2 * len(keys),
                            iparam=sp.top_k, device=device, n_threads=n_threads).view(np.int32).reshape(-1, 2)
    return out[:, 0], out[:, 1]


def lm_like(rng, n: int, scale: float) -> np.ndarray:
    """A logit row shaped like a language model's: a heavy head over a long Gaussian tail."""
    x = rng.normal(0, 2.0, n).astype(np.float32)
    head = rng.choice(n, 30, replace=False)
    x[head] += rng.exponential(scale, 30).astype(np.float32) + 8
    return x


def rows_for_test(rng, n: int) -> list[np.ndarray]:
    rows = [lm_like(rng, n, s) for s in (0.5, 2.0, 6.0)]
    rows.append(rng.normal(0, 0.05, n).astype(np.float32))                  # flat: thresholds deep in the vocabulary
    tied = np.full(n, -3.0, np.float32)
    tied[:7] = 5.0                                                            # ties at the top
    tied[100:3100] = 1.0                                                      # a boundary bucket of 3,000 tied logits
    rows.append(tied)
    wide = rng.normal(0, 1, n).astype(np.float32)
    wide[rng.choice(n, 3, replace=False)] = 60.0                              # the rest beyond 32 nats: the last bucket
    rows.append(wide)
    holes = lm_like(rng, n, 2.0)
    holes[rng.choice(n, n // 3, replace=False)] = -np.inf                     # masked tokens
    holes[rng.choice(n, 5, replace=False)] = np.nan
    rows.append(holes)
    return rows


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_op_equals_host_twin(setting):
    """Token and kept-set size equal ``sample_row``'s on rows that take every path of the kernel."""
    sp = SamplingParams(**setting)
    rng = np.random.default_rng(len(str(setting)))
    for n in (50, 5000, 40_000):
        rows = rows_for_test(rng, n)
        keys = [draw_key(123, 1000 * n + r) for r in range(len(rows))]
        ids, kept = op_draw(np.stack(rows), keys, sp)
        for r, (row, key) in enumerate(zip(rows, keys)):
            want = sample_row(row, sp, key)
            assert (int(ids[r]), int(kept[r])) == want, f"n={n} row {r}: op {(ids[r], kept[r])} host {want}"


def test_special_rows():
    """No finite logit: (-1, 0). A +inf logit: the kept set is the +inf logits, whatever the filters."""
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=3)
    none = np.full(64, -np.inf, np.float32)
    none[3] = np.nan
    inf = np.zeros(64, np.float32)
    inf[[5, 9]] = np.inf
    ids, kept = op_draw(np.stack([none, inf]), [1, 2], sp)
    assert (ids[0], kept[0]) == (-1, 0)
    assert ids[1] in (5, 9) and kept[1] == 2
    assert sample_row(none, sp, 1) == (-1, 0) and sample_row(inf, sp, 2) == (int(ids[1]), 2)


def test_top_p_boundary_is_exact():
    """Masses of exact powers of two: the nucleus ends exactly where the cumulative mass reaches top_p
    (a token more if it falls short by one ulp), with ties at the boundary kept."""
    p = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625], np.float64)
    x = np.log(p).astype(np.float32)
    for top_p, want in ((0.5, 1), (0.75, 2), (0.75 + 1e-6, 3), (0.875, 3), (0.9, 5), (1.0, 5)):
        sp = SamplingParams(temperature=1.0, top_p=top_p)
        assert int(kept_set(x, sp).sum()) == want
        assert op_draw(x[None], [7], sp)[1][0] == want, f"top_p={top_p}"


def test_tree_size_does_not_change_a_draw():
    """A row's token depends on its logits and key only: the same row among 1 or 64 rows draws the same."""
    rng = np.random.default_rng(5)
    sp = SamplingParams(temperature=0.8, top_p=0.95)
    rows = np.stack([lm_like(rng, 3000, 2.0) for _ in range(64)])
    keys = [draw_key(9, 40 + r) for r in range(64)]
    many = op_draw(rows, keys, sp)[0]
    for r in (0, 17, 63):
        assert op_draw(rows[r:r + 1], [keys[r]], sp)[0][0] == many[r]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_a_row_split_over_threads_draws_as_a_whole_row(setting):
    """Fewer rows than threads (a plain step): each row is split over the threads in chunks of 2,048
    tokens (some threads without a chunk at n = 50 and 5,000); token and kept-set size are the host
    twin's and the per-row kernel's for 1 to 4 threads, on rows that take every path of the kernel."""
    sp = SamplingParams(**setting)
    rng = np.random.default_rng(7 + len(str(setting)))
    for n in (50, 5000, 40_000):
        rows = rows_for_test(rng, n)
        keys = [draw_key(321, 1000 * n + r) for r in range(len(rows))]
        whole = op_draw(np.stack(rows), keys, sp, n_threads=1)
        for r, (row, key) in enumerate(zip(rows, keys)):
            want = sample_row(row, sp, key)
            assert (int(whole[0][r]), int(whole[1][r])) == want
            for nt in (2, 3, 4):
                ids, kept = op_draw(row[None], [key], sp, n_threads=nt)
                assert (int(ids[0]), int(kept[0])) == want, f"n={n} row {r} threads {nt}"
    none = np.full(5000, -np.inf, np.float32)
    inf = np.zeros(5000, np.float32)
    inf[[5, 4100]] = np.inf
    for nt in (2, 3):
        assert tuple(map(int, np.concatenate(op_draw(none[None], [1], sp, n_threads=nt)))) == (-1, 0)
        assert tuple(map(int, np.concatenate(op_draw(inf[None], [2], sp, n_threads=nt)))) == sample_row(inf, sp, 2)


@pytest.mark.parametrize("setting", SETTINGS[:6], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_op_draws_follow_the_processed_distribution(setting):
    """6,000 draws of one row with 6,000 keys: chi-square against ``target_probs`` (false alarm 1e-4)."""
    sp = SamplingParams(**setting)
    rng = np.random.default_rng(11)
    x = lm_like(rng, 400, 1.0)
    n = 6000
    ids = op_draw(np.repeat(x[None], n, axis=0), [draw_key(77, pos) for pos in range(n)], sp)[0]
    p = target_probs(x, sp)
    assert set(np.unique(ids)) <= set(np.flatnonzero(p > 0))
    counts = np.bincount(ids, minlength=len(p))
    expect = n * p
    big = expect >= 5                                  # pool the rare tokens into one cell
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expect[big], expect[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, exp).pvalue > 1e-4


@pytest.mark.gpu
def test_cuda_kernel_equals_cpu():
    """On a GPU build: the CUDA kernel's tokens and kept-set sizes equal the CPU kernel's."""
    rng = np.random.default_rng(3)
    rows = np.stack(rows_for_test(rng, 151_936))
    keys = [draw_key(1, r) for r in range(len(rows))]
    for setting in SETTINGS:
        sp = SamplingParams(**setting)
        gpu = op_draw(rows, keys, sp, device="gpu")
        cpu = op_draw(rows, keys, sp, device="cpu")
        assert np.array_equal(gpu[0], cpu[0]) and np.array_equal(gpu[1], cpu[1]), setting


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        native.sample_attach(None, 0.0, 0, 1.0, 0.0, 1, 1)
    with pytest.raises(ValueError):
        native.sample_attach(None, 0.7, 0, 1.0, 0.0, -1, 1)
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2), dict(min_p=2),
                dict(temperature=float("nan")), dict(temperature=float("inf"))):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
