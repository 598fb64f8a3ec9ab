"""The gain curve, its calibration and extrapolation, and the best budget by predicted rate."""
from __future__ import annotations

import numpy as np
import pytest

from budget_helpers import LinearCosts, policy
from tfm_local.decode.budget import best_budget, gain_curve

def test_gain_curve_is_prefix_sums_of_path_probabilities():
    lp = np.log([0.9, 0.5, 0.3])
    np.testing.assert_allclose(gain_curve(lp, 5), [0.9, 1.4, 1.7, 1.7, 1.7])
    np.testing.assert_allclose(gain_curve(lp, 2), [0.9, 1.4])
    np.testing.assert_allclose(gain_curve(np.zeros(0), 2), [0.0, 0.0])


def test_best_budget_cpu_like_costs_choose_plain_gpu_like_choose_a_tree():
    curve = gain_curve(np.log(np.linspace(0.6, 0.05, 63)), 63)  # about 20 accepted at most
    cpu = LinearCosts(0.035, 0.06)   # a pass costs ~60 ms per token: verification is compute-bound
    gpu = LinearCosts(0.004, 0.00002)
    assert best_budget(cpu, 0.03, curve * 0.05, 1.0, 63) == 0
    b = best_budget(gpu, 0.001, curve, 1.0, 63)
    assert b > 32
    assert best_budget(cpu, 0.03, curve * 0.05, 1.0, 63, speculative_only=True) >= 1
    assert best_budget(gpu, 0.001, curve, 1.0, 0) == 0


def test_best_budget_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(50):
        curve = np.cumsum(rng.uniform(0, 1, 20) ** 3)
        costs, d, r = LinearCosts(rng.uniform(0.01, 0.1), rng.uniform(0, 0.02)), rng.uniform(0, 0.05), 0.7
        rates = [1 / costs.estimate(1) * 1.03] + [(1 + r * curve[b - 1]) / (costs.estimate(b + 1) + d)
                                                  for b in range(1, 21)]
        want = int(np.argmax(rates))
        assert best_budget(costs, d, curve, r, 20) == want


def test_extrapolate_continues_a_short_curve_as_a_chain():
    from tfm_local.decode.budget import extrapolate

    np.testing.assert_allclose(extrapolate([0.8], 4), np.cumsum([0.8, 0.64, 0.512, 0.4096]))
    np.testing.assert_allclose(extrapolate([0.9, 1.7], 4), [0.9, 1.7, 1.7 + 0.8 * 8 / 9, 1.7 + 0.8 * 8 / 9 + 0.8 * (8 / 9) ** 2])
    np.testing.assert_allclose(extrapolate([1.0], 3), [1.0, 1.95, 1.95 + 0.9025])  # rate clamped to 0.95
    np.testing.assert_allclose(extrapolate([0.5, 0.5], 3), [0.5, 0.5, 0.5])         # no gain: stays flat
    assert extrapolate([], 2).tolist() == [0.0, 0.0] and extrapolate([1, 2, 3], 2).tolist() == [1, 2, 3]


def test_a_curve_beyond_a_shallow_probes_depth_is_the_drafters_own():
    """A probe drafts only its budget deep and the rest of its curve is extrapolated (as a chain: every
    further position right as often as the last); the first full curve a speculative step brings replaces
    that extrapolation instead of being blended into it (after a 1-deep probe that accepted, the
    extrapolation priced budget 31 at ~9 tokens and the blend kept it there for 14 steps on a text whose
    drafts took ~1.5; replayed MT-Bench). Within the probe's depth the two blend as before."""
    auto = policy(gpu=True)
    auto.observe_plain(0.002)
    auto.observe_spec(2, 0.0023, 0.001, np.array([0.95]), 1, 1, probe=True)   # a 1-deep probe
    assert auto.gain.depth == 1 and auto.gain.upto(31)[30] > 8                    # extrapolated as a chain
    full = gain_curve(np.log(np.full(63, 0.6)) * np.arange(1, 64), 63)    # the drafter's real curve
    auto.observe_spec(32, 0.0069, 0.001, full, 31, 1)
    blend = (1 - auto.config.alpha) * 0.95 + auto.config.alpha * full[0]
    assert auto.gain.curve[0] == pytest.approx(blend)
    np.testing.assert_allclose(np.diff(auto.gain.curve[:63]), np.diff(full), atol=1e-12)
    assert auto.gain.depth == 63 and auto.gain.upto(31)[30] < 2
    old = policy(gpu=True, measured_depth=False)
    old.observe_plain(0.002)
    old.observe_spec(2, 0.0023, 0.001, np.array([0.95]), 1, 1, probe=True)
    old.observe_spec(32, 0.0069, 0.001, full, 31, 1)
    assert old.gain.upto(31)[30] > 6


def test_a_blend_beyond_the_measured_depth_never_falls():
    """A new curve shorter than the running one (the context's room cut the draft) but deeper than its
    measured depth continues to the running curve's length with its own increments: the curve never
    falls (it did where the replaced part met the old blend)."""
    auto = policy(gpu=True)
    auto.observe_plain(0.002)
    full = gain_curve(np.log(np.full(63, 0.6)) * np.arange(1, 64), 63)
    auto.observe_spec(64, 0.007, 0.001, full, 63, 1)
    auto.observe_spec(8, 0.003, 0.001, np.full(7, 0.05), 7, 0, probe=True)   # a 7-deep probe that missed
    assert auto.gain.depth == 7 and len(auto.gain.curve) == 63
    good = gain_curve(np.log(np.full(20, 0.9)) * np.arange(1, 21), 20)
    auto.observe_spec(21, 0.004, 0.001, good, 20, 5)
    assert np.all(np.diff(auto.gain.curve) >= -1e-12) and auto.gain.curve[62] >= auto.gain.curve[19]
