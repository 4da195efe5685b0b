"""1:1 verification: pair sampling, exact threshold search and 10-fold accuracy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raycompat.metrics import best_threshold, make_pairs, pair_distances, verification_accuracy
from raycompat.metrics.verification import _default_folds


def _features_at_distances(distances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Query i = e0, gallery i on the unit circle with squared L2 distance d_i to e0."""
    cos = 1.0 - np.asarray(distances) / 2.0
    query = np.tile([1.0, 0.0], (len(cos), 1))
    gallery = np.stack([cos, np.sqrt(1.0 - cos**2)], axis=1)
    return query, gallery


def _naive_accuracy(d: np.ndarray, same: np.ndarray, folds: np.ndarray) -> float:
    """Loop over every candidate threshold; the first (smallest) best one wins."""
    accuracies = []
    for f in sorted(set(folds.tolist())):
        train = [(x, s) for x, s, g in zip(d, same, folds, strict=True) if g != f]
        values = sorted({x for x, _ in train})
        midpoints = [(a + b) / 2 for a, b in zip(values[:-1], values[1:], strict=True)]
        candidates = [-np.inf, *midpoints, np.inf]
        best, best_correct = None, -1
        for t in candidates:
            correct = sum((x < t) == (s == 1) for x, s in train)
            if correct > best_correct:
                best, best_correct = t, correct
        test = [(x < best) == (s == 1) for x, s, g in zip(d, same, folds, strict=True) if g == f]
        accuracies.append(np.mean(test))
    return float(np.mean(accuracies))


def test_hand_worked_two_folds():
    # fold 0: 0.1 S, 0.5 D, 0.35 S, 0.9 D ; fold 1: 0.2 S, 0.6 D, 0.7 S, 0.4 D
    # Test fold 0, train fold 1: best cut after 0.2 (3 of 4 right), threshold 0.3 -> fold 0 gets
    # 0.1 S, 0.5 D, 0.9 D right and 0.35 S wrong: 3/4.
    # Test fold 1, train fold 0: best cut after 0.35 (4 of 4), threshold 0.425 -> fold 1 gets
    # 0.2 S, 0.6 D right, 0.7 S and 0.4 D wrong: 2/4.  Mean 0.625.
    d = np.array([0.1, 0.5, 0.35, 0.9, 0.2, 0.6, 0.7, 0.4])
    same = np.array([1, 0, 1, 0, 1, 0, 1, 0])
    folds = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    query, gallery = _features_at_distances(d)
    pairs = np.stack([np.arange(8), np.arange(8), same], axis=1)
    np.testing.assert_allclose(pair_distances(query, gallery, pairs), d, atol=1e-12)
    assert verification_accuracy(query, gallery, pairs, folds=folds) == pytest.approx(0.625)
    assert best_threshold(d[4:], same[4:]) == pytest.approx(0.3)
    assert best_threshold(d[:4], same[:4]) == pytest.approx(0.425)


def test_best_threshold_ends_and_ties():
    assert best_threshold(np.array([0.5, 1.0]), np.array([0, 0])) == -np.inf
    assert best_threshold(np.array([0.5, 1.0]), np.array([1, 1])) == np.inf
    # Equal distances with different labels: no cut between them; the smallest best cut wins.
    assert best_threshold(np.array([1.0, 1.0, 2.0]), np.array([1, 0, 0])) == -np.inf


def test_perfectly_separable_is_one():
    rng = np.random.default_rng(0)
    same = np.repeat([1, 0], 50)
    d = np.where(same == 1, rng.uniform(0.0, 0.8, 100), rng.uniform(1.2, 4.0, 100))
    query, gallery = _features_at_distances(d)
    pairs = np.stack([np.arange(100), np.arange(100), same], axis=1)
    assert verification_accuracy(query, gallery, pairs) == 1.0
    flipped = pairs.copy()
    flipped[:, 2] = 1 - same
    assert verification_accuracy(query, gallery, flipped) == pytest.approx(0.5)  # all "diff"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_reference_across_two_models(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 6, 120)
    centres = rng.normal(size=(6, 8))
    old = centres[labels] + 1.2 * rng.normal(size=(120, 8))
    new = old @ np.linalg.qr(rng.normal(size=(8, 8)))[0] * 0.2 + 0.8 * old  # another model
    pairs = make_pairs(labels, 100, 100, seed=seed)
    folds = rng.integers(0, 10, len(pairs))
    d = pair_distances(new, old, pairs)
    want = _naive_accuracy(d, pairs[:, 2], folds)
    assert verification_accuracy(new, old, pairs, folds=folds) == pytest.approx(want)
    assert 0.5 < want < 1.0  # a non-trivial case


def test_default_folds_are_seeded_and_balanced():
    same = np.repeat([1, 0], 3000)
    folds = _default_folds(same, 10, seed=0)
    for f in range(10):
        assert (same[folds == f] == 1).sum() == 300 and (same[folds == f] == 0).sum() == 300
    np.testing.assert_array_equal(folds, _default_folds(same, 10, seed=0))
    assert (folds != _default_folds(same, 10, seed=1)).any()
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 4))
    pairs = make_pairs(np.arange(40) % 4, 30, 30, seed=0)
    assert verification_accuracy(x, x, pairs, seed=4) == verification_accuracy(x, x, pairs,
                                                                               seed=4)


def test_make_pairs_properties():
    labels = np.random.default_rng(0).integers(0, 10, 1000)
    pairs = make_pairs(labels, 3000, 3000, seed=0)
    assert pairs.shape == (6000, 3) and pairs.dtype == np.int64
    i, j, same = pairs.T
    assert (i < j).all()  # no self pairs, canonical order
    assert len({(a, b) for a, b in zip(i, j, strict=True)}) == 6000  # no duplicates
    np.testing.assert_array_equal(same, (labels[i] == labels[j]).astype(np.int64))
    assert same[:3000].all() and not same[3000:].any()
    np.testing.assert_array_equal(pairs, make_pairs(labels, 3000, 3000, seed=0))
    assert (pairs != make_pairs(labels, 3000, 3000, seed=1)).any()


def test_make_pairs_can_take_every_pair():
    labels = torch.tensor([0, 0, 0, 1, 1, 2])  # 3 + 1 positive pairs, 15 - 4 = 11 negative
    pairs = make_pairs(labels, 4, 11, seed=3)
    assert {tuple(p) for p in pairs[:4, :2]} == {(0, 1), (0, 2), (1, 2), (3, 4)}
    assert len({tuple(p) for p in pairs[4:, :2]}) == 11
    with pytest.raises(ValueError, match="asked for 5 positive pairs but only 4 exist"):
        make_pairs(labels, 5, 1)
    with pytest.raises(ValueError, match="only 11 exist"):
        make_pairs(labels, 1, 12)


def test_bad_inputs():
    x = np.random.default_rng(0).normal(size=(10, 4))
    good = np.array([[0, 1, 1], [2, 3, 0], [4, 5, 1], [6, 7, 0]])
    with pytest.raises(ValueError, match="pair row 1: index 12 out of range for gallery"):
        verification_accuracy(x, x, [[0, 1, 1], [2, 12, 0]], num_folds=2)
    with pytest.raises(ValueError, match="pair row 0: index -1 out of range for query"):
        verification_accuracy(x, x, [[-1, 1, 1], [2, 3, 0]], num_folds=2)
    with pytest.raises(ValueError, match="'same' must be 0 or 1"):
        verification_accuracy(x, x, [[0, 1, 2], [2, 3, 0]], num_folds=2)
    with pytest.raises(ValueError, match=r"\(P, 3\)"):
        verification_accuracy(x, x, [[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="integers"):
        verification_accuracy(x, x, good.astype(float), num_folds=2)
    bad = x.copy()
    bad[3, 0] = np.nan
    with pytest.raises(ValueError, match="query_features.*row 3"):
        verification_accuracy(bad, x, good, num_folds=2)
    with pytest.raises(ValueError, match="width"):
        verification_accuracy(x[:, :2], x, good, num_folds=2)
    with pytest.raises(ValueError, match="num_folds must be in"):
        verification_accuracy(x, x, good, num_folds=10)
    with pytest.raises(ValueError, match="folds must have shape"):
        verification_accuracy(x, x, good, folds=[0, 1])
    with pytest.raises(ValueError, match="at least 2 distinct folds"):
        verification_accuracy(x, x, good, folds=[0, 0, 0, 0])
    with pytest.raises(ValueError, match="labels must be 1-D"):
        make_pairs(np.zeros((3, 2)), 1, 1)
