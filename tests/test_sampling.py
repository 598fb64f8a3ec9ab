"""Logit processing, the keyed Gumbel-max draw on the host and stop strings."""
import numpy as np
import pytest
from scipy import stats

from tfm_local.decode.sampling import SamplingParams, TokenChooser, draw_key, kept_set, sample_row, target_probs
from tfm_local.stops import StopMatcher


def test_temperature_only_is_softmax():
    x = np.array([1.0, 2.0, 0.5, -1.0], np.float32)
    q = target_probs(x, SamplingParams(temperature=0.5))
    ref = np.exp(x / 0.5) / np.exp(x / 0.5).sum()
    assert np.allclose(q, ref)


def test_top_k_top_p_min_p_cut_the_tail():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.count_nonzero(target_probs(x, SamplingParams(temperature=1, top_k=2))) == 2
    assert np.count_nonzero(target_probs(x, SamplingParams(temperature=1, top_p=0.75))) == 2
    assert np.count_nonzero(target_probs(x, SamplingParams(temperature=1, top_p=0.85))) == 3
    assert np.count_nonzero(target_probs(x, SamplingParams(temperature=1, min_p=0.2))) == 3
    q = target_probs(x, SamplingParams(temperature=1, top_k=2))
    assert np.allclose(q[:2], [0.5 / 0.8, 0.3 / 0.8])


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.6, top_p=0.9),
                                SamplingParams(temperature=1.4, top_k=3, min_p=0.05)])
def test_keyed_draws_match_the_distribution(sp):
    """20,000 draws with 20,000 keys: chi-square against target_probs (false-alarm rate 1e-4)."""
    x = np.log(np.array([0.1, 1e-9, 0.4, 0.2, 0.25, 0.05])).astype(np.float32)
    p = target_probs(x, sp)
    draws = np.array([sample_row(x, sp, draw_key(3, pos))[0] for pos in range(20000)])
    counts = np.bincount(draws, minlength=len(p))
    assert counts[p == 0].sum() == 0
    nz = p > 0
    assert stats.chisquare(counts[nz], 20000 * p[nz]).pvalue > 1e-4


def test_a_draw_depends_on_seed_and_position_only():
    x = np.random.default_rng(0).normal(0, 1, 1000).astype(np.float32)
    sp = SamplingParams(temperature=1.0, seed=5)
    a, b = TokenChooser(sp), TokenChooser(sp)
    assert [a(x, pos) for pos in range(50)] == [b(x, pos) for pos in reversed(range(50))][::-1]
    assert len({a(x, pos) for pos in range(50)}) > 10
    assert TokenChooser(SamplingParams(temperature=1.0, seed=6))(x, 0) != a(x, 0) or \
        TokenChooser(SamplingParams(temperature=1.0, seed=6))(x, 1) != a(x, 1)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2),
                                 dict(min_p=2), dict(top_k=2.5), dict(top_k=True), dict(seed=1.5),
                                 dict(seed="abc"), dict(temperature="0.7"), dict(top_p=None)])
def test_bad_sampling_params(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_edge_settings_follow_llama_cpp():
    """A temperature float32 cannot tell from 0 is greedy; seed -1 (and None) draws a random seed."""
    assert SamplingParams(temperature=1e-300).greedy and not SamplingParams(temperature=1e-30).greedy
    seeds = {TokenChooser(SamplingParams(temperature=1.0, seed=-1)).seed for _ in range(4)}
    assert len(seeds) == 4
    assert TokenChooser(SamplingParams(temperature=1.0, seed=5 + 2 ** 64)).seed == 5


def test_stop_strings_hold_back_prefixes():
    m = StopMatcher(["</s>", "STOP"])
    assert m.feed("hello <") == ("hello ", False)
    assert m.feed("/") == ("", False)
    assert m.feed("x") == ("</x", False)
    assert m.feed(" and ST") == (" and ", False)
    assert m.feed("OP more") == ("", True)
    m = StopMatcher(None)
    assert m.feed("abc") == ("abc", False)


def _full_sort_top_p(x: np.ndarray, top_p: float) -> np.ndarray:
    """top-p's kept set written with one sort of the whole row (kept_set sorts only the prefix it needs)."""
    e = np.exp(x - x.max()).astype(np.float32)
    ids = np.arange(x.shape[0])
    order = ids[np.lexsort((ids, -x))]
    cum = np.cumsum(e[order].astype(np.float64))
    j = min(int(np.searchsorted(cum, top_p * cum[-1])), len(order) - 1)
    return x >= x[order[j]]


@pytest.mark.parametrize("scale", [0.01, 0.5, 2.0, 8.0])
def test_top_p_sorts_only_the_prefix_it_needs(scale):
    """Peaked rows (a nucleus of a few tokens) and flat ones (thousands: the prefix grows past 256 and
    2048 candidates), with ties at the cut: the kept set of a full sort."""
    rng = np.random.default_rng(int(scale * 100))
    for top_p in (0.1, 0.5, 0.9, 0.999):
        for _ in range(5):
            x = (rng.standard_normal(20000) * scale).astype(np.float32)
            x[rng.integers(0, 20000, 300)] = np.float32(np.quantile(x, 0.99))  # ties among the top
            got = kept_set(x, SamplingParams(temperature=1.0, top_p=top_p))
            assert np.array_equal(got, _full_sort_top_p(x, top_p)), (scale, top_p)
