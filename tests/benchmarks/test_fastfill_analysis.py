"""benchmarks/fastfill_analysis.py: the per-row measures behind docs/backfill.md's "Why an order
loses", against naive references (the fits themselves are the core's, tested in
tests/backfill/test_backfill.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.benchmarks import benchmark_modules


@pytest.fixture(scope="module")
def analysis():
    yield from benchmark_modules("fastfill_analysis")


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _correct(new, gallery, labels):
    sim = _unit(new) @ _unit(gallery).T
    np.fill_diagonal(sim, -np.inf)
    return labels[sim.argmax(axis=1)] == labels


def test_single_row_impact_is_backfilling_each_row_alone(analysis):
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 4, 40)
    new = rng.standard_normal((40, 5))
    transformed = new + 0.8 * rng.standard_normal((40, 5))
    impact = analysis.single_row_impact(new, transformed, new, labels)
    before = _correct(new, transformed, labels).sum()
    naive = []
    for row in range(40):
        gallery = transformed.copy()
        gallery[row] = new[row]
        naive.append(int(_correct(new, gallery, labels).sum() - before))
    assert impact.tolist() == naive
    assert any(naive) and min(naive) < 0 < max(naive)  # both kinds of change occur


def test_coverage_by_hand(analysis):
    # Two classes on a line of angles: rows 0, 1 (class 0) and 2, 3 (class 1); each row's
    # nearest same-class row is its partner.
    angles = np.array([0.0, 0.1, 1.5, 1.6])
    new = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = np.array([0, 0, 1, 1])
    orders = {"first_class": np.array([0, 1, 2, 3]), "spread": np.array([0, 2, 1, 3])}
    out = analysis.coverage(new, labels, orders, fraction=0.5)
    # first_class backfills rows 0, 1: queries 0 and 1 have their partner re-extracted.
    assert out["first_class"] == {"nearest_same_class": 0.5, "largest_class_share": 1.0}
    # spread backfills rows 0, 2: the partners of queries 1 and 3.
    assert out["spread"] == {"nearest_same_class": 0.5, "largest_class_share": 0.5}
    assert out["gallery_largest_class_share"] == 0.5
