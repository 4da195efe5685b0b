"""Evaluation protocols and the CoReS selection score against hand-worked values."""

import numpy as np
import pytest

from raycompat.evaluation import EvalSet, matrix_row, score, selection_score


def naive_identification(features: np.ndarray, labels: np.ndarray) -> float:
    f = features / np.linalg.norm(features, axis=1, keepdims=True)
    sims = f @ f.T
    np.fill_diagonal(sims, -np.inf)
    return float(np.mean(labels[np.argmax(sims, axis=1)] == labels))


def test_identification_score_is_the_brute_force_top1():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(50, 4)).astype(np.float32)
    labels = rng.integers(0, 5, size=50)
    value = score("identification", features, features, EvalSet(labels))
    assert value == pytest.approx(naive_identification(features, labels))


def test_cross_test_on_hand_built_features():
    # Two classes on the axes; the new model rotates class 1 onto class 0's axis for item 3.
    old = np.array([[1, 0], [1, 0.1], [0, 1], [0.1, 1]], dtype=np.float32)
    new = np.array([[1, 0], [1, 0.1], [0, 1], [1, 0.05]], dtype=np.float32)
    labels = np.array([0, 0, 1, 1])
    assert score("identification", old, old, EvalSet(labels)) == 1.0
    # query 3 (new, ~class 0 direction) against old gallery: nearest is item 0 or 1 -> miss;
    # query 2 (class 1) nearest other is item 3 (0.1, 1) -> hit; queries 0, 1 hit.
    assert score("identification", new, old, EvalSet(labels)) == 0.75
    # new/new: item 3 now sits on class 0's axis, so every query's nearest is the other class
    # (q0 -> 3, q1 -> 3, q2 -> 1, q3 -> 0 or 1): self-test 0.
    assert matrix_row("identification", new, [old], EvalSet(labels), "cosine") == [0.75, 0.0]


def test_wider_features_are_compared_on_the_shared_coordinates():
    old = np.array([[1, 0], [1, 0.1], [0, 1], [0.1, 1]], dtype=np.float32)
    new = np.concatenate([old, np.ones((4, 3), dtype=np.float32) * 100], axis=1)
    assert score("identification", new, old, EvalSet(np.array([0, 0, 1, 1]))) == 1.0


def test_templates_protocol_uses_even_rows_as_queries():
    features = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=np.float32)
    assert score("templates", features, features, EvalSet(np.array([0, 0, 1, 1]))) == 1.0
    swapped = features[[2, 3, 0, 1]]  # gallery templates of the other class
    assert score("templates", features, swapped, EvalSet(np.array([0, 0, 1, 1]))) == 0.0


def test_verification_needs_pairs():
    with pytest.raises(ValueError, match="needs pairs"):
        score("verification", np.eye(4), np.eye(4), EvalSet(np.arange(4)))


def test_selection_score_prefers_compatible_epochs():
    assert selection_score(0.9, 0.5, 0.6) == (0.9, False)
    assert selection_score(0.7, 0.65, 0.6) == (1.7, True)
    assert selection_score(0.7, 0.6, 0.6) == (0.7, False)  # strict ECC
    assert selection_score(0.7, 0.6, 0.6, strict=False) == (1.7, True)
    assert selection_score(0.4, None, None) == (1.4, True)
