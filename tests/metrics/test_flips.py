"""Negative and positive flip rates (Yan et al., CVPR 2021) against hand-worked values."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.metrics import flip_rates, identification_flips, top1_hits


def test_flip_rates_of_six_hand_counted_samples():
    old = [1, 1, 1, 0, 0, 1]
    new = [1, 0, 1, 1, 0, 0]
    flips = flip_rates(old, new)
    # old right and new wrong: samples 1 and 5; old wrong and new right: sample 3.
    assert flips.negative == pytest.approx(2 / 6)
    assert flips.positive == pytest.approx(1 / 6)
    assert flips.old_accuracy == pytest.approx(4 / 6) and flips.new_accuracy == pytest.approx(3 / 6)
    assert flips.new_accuracy - flips.old_accuracy == pytest.approx(flips.positive - flips.negative)
    # (2/6) / ((1 - 3/6) * 4/6) = (1/3) / (1/3)
    assert flips.relative_negative == pytest.approx(1.0)
    assert flips.negative_of_old_hits == pytest.approx(2 / 4)  # 2 of the 4 old hits break


def test_only_valid_samples_count():
    flips = flip_rates([1, 1, 0], [0, 1, 1], valid=[True, True, False])
    assert (flips.n, flips.negative, flips.positive) == (2, 0.5, 0.0)


def test_a_perfect_old_model_has_no_defined_relative_rate_when_the_new_is_perfect_too():
    flips = flip_rates([1, 1], [1, 1])
    assert flips.negative == 0.0 and np.isnan(flips.relative_negative)


@pytest.mark.parametrize("old, new, valid", [([1, 0], [1], None), ([1, 0], [1, 0], [True]),
                                             ([1], [1], [False])])
def test_mismatched_or_empty_inputs_are_refused(old, new, valid):
    with pytest.raises(ValueError):
        flip_rates(old, new, valid)


def test_identification_flips_of_four_hand_placed_images():
    """Labels 0, 0, 1, 1. Old features: each image's nearest other image is its pair, so all
    four queries hit. New features: image 1 moved towards class 1, so (cosine, query excluded
    by index) query 1's nearest is image 3 (0.995 against 0.196 for image 0) and query 3's
    nearest is image 1 (1.02 / (1.00499 * 1.0198) = 0.99523 against 0.99504 for image 2):
    two of four break, none is repaired."""
    labels = np.array([0, 0, 1, 1])
    old = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.1, 1.0]])
    new = np.array([[1.0, 0.0], [0.2, 1.0], [0.0, 1.0], [0.1, 1.0]])
    hits, valid = top1_hits(new, new, labels, labels, exclude_self=True)
    assert hits.tolist() == [True, False, True, False] and valid.all()
    flips = identification_flips(old, old, new, new, labels)
    assert (flips.n, flips.old_accuracy, flips.new_accuracy) == (4, 1.0, 0.5)
    assert (flips.negative, flips.positive) == (0.5, 0.0)
