"""Logit processing, inverse-CDF sampling and stop strings."""
import numpy as np
import pytest
from scipy import stats

from tfm_local.decode.sampling import SamplingParams, sample, target_probs
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


def test_inverse_cdf_sampling_matches_distribution():
    """Chi-square goodness of fit (false-alarm rate 1e-3)."""
    p = np.array([0.1, 0.0, 0.4, 0.2, 0.3])
    rng = np.random.default_rng(0)
    draws = np.array([sample(p, rng.random()) for _ in range(20000)])
    counts = np.bincount(draws, minlength=5)
    assert counts[1] == 0
    nz = p > 0
    assert stats.chisquare(counts[nz], 20000 * p[nz]).pvalue > 1e-3


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2),
                                 dict(min_p=2)])
def test_bad_sampling_params(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_stop_strings_hold_back_prefixes():
    m = StopMatcher(["</s>", "STOP"])
    assert m.feed("hello <") == ("hello ", False)
    assert m.feed("/") == ("", False)
    assert m.feed("x") == ("</x", False)
    assert m.feed(" and ST") == (" and ", False)
    assert m.feed("OP more") == ("", True)
    m = StopMatcher(None)
    assert m.feed("abc") == ("abc", False)
