"""Student's t intervals (raycompat/metrics/intervals.py) against hand-worked values:
t(0.975, 4) = 2.776445, so for 5 seeds with sd 1 the mean's half-width is 2.776445 / sqrt(5) =
1.241664 and a new run's 2.776445 sqrt(1.2) = 3.041443."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.metrics.intervals import mean_interval, prediction_interval


def test_hand_worked_half_widths_for_five_seeds():
    assert mean_interval(10.0, 1.0, 5) == pytest.approx((10 - 1.241664, 10 + 1.241664), abs=1e-6)
    assert prediction_interval(10.0, 1.0, 5) == pytest.approx(
        (10 - 3.041443, 10 + 3.041443), abs=1e-6
    )
    # two seeds: t(0.975, 1) = 12.706205
    assert mean_interval(0.0, 2.0, 2)[1] == pytest.approx(12.706205 * 2 / np.sqrt(2), rel=1e-6)


def test_fewer_than_two_seeds_have_no_interval_and_a_bad_level_is_refused():
    assert mean_interval(3.0, None, 1) is None and prediction_interval(3.0, 0.0, 1) is None
    with pytest.raises(ValueError, match="level must be in"):
        mean_interval(0.0, 1.0, 5, level=1.0)


def test_a_new_run_lands_in_the_prediction_interval_at_its_level():
    """Simulated: 5 seeds and one more run from the same normal distribution, 4000 times."""
    rng = np.random.default_rng(0)
    draws = rng.normal(50.0, 3.0, size=(4000, 6))
    inside = 0
    for row in draws:
        seeds, new = row[:5], row[5]
        low, high = prediction_interval(seeds.mean(), seeds.std(ddof=1), 5)
        inside += low <= new <= high
    assert 0.93 <= inside / len(draws) <= 0.97  # 0.95; binomial sd 0.0034
