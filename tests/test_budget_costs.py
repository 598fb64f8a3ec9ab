"""The automatic budget's costs: running means and the target's pass costs by size."""
from __future__ import annotations

import numpy as np
import pytest

from tfm_local.decode.budget import DraftCosts, PassCosts

def test_pass_costs_interpolate_and_extrapolate():
    c = PassCosts(alpha=0.5)
    assert c.estimate(4) is None
    c.record(1, 0.10)
    assert c.estimate(1) == pytest.approx(0.10) and c.estimate(64) == pytest.approx(0.10)
    c.record(5, 0.30)
    assert c.estimate(3) == pytest.approx(0.20)
    assert c.estimate(9) == pytest.approx(0.50)  # slope of the last segment
    c.record(5, 0.50)  # the second sample replaces the first (a first pass may be a cold one)
    assert c.estimate(5) == pytest.approx(0.50)
    c.record(5, 0.30)  # running mean: 0.5·0.50 + 0.5·0.30
    assert c.estimate(5) == pytest.approx(0.40)
    np.testing.assert_allclose(c.estimate(np.array([1, 3])), [0.10, 0.25])
    c.record(0, 1.0)
    c.record(2, -1.0)
    assert not c.known(0) and not c.known(2)


def test_running_costs_forget_a_cold_first_sample_and_cap_outliers():
    """The H200's first 2-token pass took 26.5 ms and its first drafter call 19 ms, against 1.9 and 2.1
    ms after: the second sample replaces the first, and a later outlier counts at most twice the
    mean (a real slowdown still comes through within a few steps)."""
    from tfm_local.decode.budget import OUTLIER, running_cost

    c = PassCosts(alpha=0.3)
    c.record(2, 0.0265)
    c.record(2, 0.0019)
    assert c.estimate(2) == pytest.approx(0.0019)
    c.record(2, 0.1)  # a collection pause
    assert c.estimate(2) == pytest.approx(0.7 * 0.0019 + 0.3 * OUTLIER * 0.0019)
    m = 0.002
    for _ in range(12):  # the machine got 5x slower
        m = running_cost(m, 0.010, 0.3, False)
    assert m == pytest.approx(0.010, rel=0.05)
    assert running_cost(None, 0.5, 0.3, False) == 0.5 and running_cost(0.2, 0.5, 0.3, True) == 0.5


def test_pass_costs_never_fall_with_the_pass_size():
    """A larger pass measured faster (noise) is priced as the smaller one: otherwise that size looks
    like a bargain, the budget bets on it and loses."""
    c = PassCosts()
    c.record(1, 0.2)
    c.record(8, 0.1)
    assert c.estimate(8) == pytest.approx(0.2) and c.estimate(64) == pytest.approx(0.2)
    c.record(2, 0.3)
    c.record(4, 0.25)
    c.record(6, 0.4)
    np.testing.assert_allclose(c.estimate(np.array([1, 2, 3, 4, 5, 6, 8])), [0.2, 0.3, 0.3, 0.3, 0.35, 0.4, 0.4])


def test_draft_costs_price_an_unmeasured_shallower_depth_as_half_fixed_half_rows():
    """Below the smallest depth measured a drafter pass is priced s_min · (1 + (d+1)/(d_min+1)) / 2 (a
    prior, cheaper than the measured depth and never free); measured depths price themselves, with the
    target's interpolation between them."""
    c = DraftCosts(alpha=0.5)
    assert c.estimate(3) is None
    c.record(7, 0.024)
    c.record(7, 0.024)
    assert c.estimate(7) == pytest.approx(0.024) and c.estimate(15) == pytest.approx(0.024)
    assert c.estimate(3) == pytest.approx(0.024 * (1 + 4 / 8) / 2) and c.estimate(1) == pytest.approx(0.015)
    assert 0.012 < c.estimate(0) < c.estimate(1) < c.estimate(3) < c.estimate(7)
    c.record(3, 0.017)
    c.record(3, 0.017)
    assert c.estimate(3) == pytest.approx(0.017) and c.estimate(5) == pytest.approx(0.0205)
    assert c.estimate(1) == pytest.approx(0.017 * (1 + 2 / 4) / 2)
    np.testing.assert_allclose(c.estimate(np.array([3, 5])), [0.017, 0.0205])
