"""Retrieval metrics (CMC, mAP, mAP@R, template identification) and linear CKA against naive
per-query Python references and hand-built rankings."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from raycompat.metrics import (
    cmc,
    linear_cka,
    map_at_r,
    mean_average_precision,
    template_identification,
)

# ---------------------------------------------------------------- naive references (loops)


def _naive_scores(q: np.ndarray, g: np.ndarray, distance: str) -> np.ndarray:
    out = np.empty((len(q), len(g)))
    for i, a in enumerate(q):
        for j, b in enumerate(g):
            if distance == "cosine":
                out[i, j] = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
            elif distance == "l2":
                out[i, j] = -((a - b) ** 2).sum()
            else:
                out[i, j] = a @ b
    return out


def _naive_rankings(q, g, ql, gl, distance, exclude_self):
    """Per query, the list of relevance flags in ranked order; ties put non-matches first."""
    scores = _naive_scores(q, g, distance)
    for i in range(len(q)):
        items = [j for j in range(len(g)) if not (exclude_self and j == i)]
        relevant = {j: gl[j] == ql[i] for j in items}
        ranked = sorted(items, key=lambda j: (-scores[i, j], relevant[j]))
        yield [relevant[j] for j in ranked]


def _naive_metrics(q, g, ql, gl, distance="cosine", exclude_self=False, topk=(1, 5, 10)):
    hits, aps, aprs = {k: [] for k in topk}, [], []
    for rel in _naive_rankings(q, g, ql, gl, distance, exclude_self):
        n_rel = sum(rel)
        if n_rel == 0:
            continue
        first = rel.index(True) + 1
        for k in topk:
            hits[k].append(first <= k)
        found, ap, apr = 0, 0.0, 0.0
        for pos, r in enumerate(rel, start=1):
            if r:
                found += 1
                ap += found / pos
                apr += found / pos if pos <= n_rel else 0.0
        aps.append(ap / n_rel)
        aprs.append(apr / n_rel)
    return {k: np.mean(v) for k, v in hits.items()}, np.mean(aps), np.mean(aprs)


def _check_against_naive(q, g, ql, gl, distance, exclude_self, chunk_size=None):
    want_cmc, want_map, want_mapr = _naive_metrics(q, g, ql, gl, distance, exclude_self)
    kw = dict(distance=distance, exclude_self=exclude_self, chunk_size=chunk_size)
    got = cmc(q, g, ql, gl, topk=(1, 5, 10), **kw)
    assert got == pytest.approx(want_cmc)
    assert mean_average_precision(q, g, ql, gl, **kw) == pytest.approx(want_map)
    assert map_at_r(q, g, ql, gl, **kw) == pytest.approx(want_mapr)


# ---------------------------------------------------------------- CMC / mAP / mAP@R


@pytest.mark.parametrize("distance", ["cosine", "l2", "inner_product"])
@pytest.mark.parametrize("chunk_size", [None, 7])
def test_random_data_matches_naive(distance, chunk_size):
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(23, 6)), rng.normal(size=(40, 6))
    ql, gl = rng.integers(0, 5, 23), rng.integers(0, 5, 40)
    _check_against_naive(q, g, ql, gl, distance, False, chunk_size)


@pytest.mark.parametrize("distance", ["l2", "inner_product"])
def test_ties_are_pessimistic_like_the_naive_reference(distance):
    # Small integer features: many exact ties, computed exactly in float64 on both sides.
    rng = np.random.default_rng(1)
    q = rng.integers(-1, 2, size=(30, 3)).astype(float)
    g = rng.integers(-1, 2, size=(50, 3)).astype(float)
    ql, gl = rng.integers(0, 3, 30), rng.integers(0, 3, 50)
    _check_against_naive(q, g, ql, gl, distance, False, chunk_size=8)


def test_exclude_self_matches_naive_and_uses_the_index():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(35, 5))
    y = rng.integers(0, 6, 35)
    _check_against_naive(x, x, y, y, "cosine", True, chunk_size=4)
    assert cmc(x, x, y, y, topk=(1,))[1] == 1.0  # without exclusion the query finds itself
    # Cross-model: the query set is the gallery images embedded by another model; item i is
    # still excluded by index although its features differ.
    other = x + 0.01 * rng.normal(size=x.shape)
    _check_against_naive(other, x, y, y, "l2", True)


def test_exclude_self_keeps_duplicates_at_other_indices():
    # Items 0 and 1 are the same picture (identical features), class 0. Excluding item 0 from
    # query 0's ranking must leave item 1 at the top.
    x = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.1, 1.0]])
    y = np.array([0, 0, 1, 1])
    assert cmc(x, x, y, y, topk=(1,), exclude_self=True)[1] == 1.0


def test_hand_built_ranking_with_known_ap():
    # Scores 6..1 in gallery order; relevance [1, 0, 1, 0, 0, 1].
    gallery = np.arange(6, 0, -1, dtype=float)[:, None]
    gl = np.array([0, 1, 0, 1, 1, 0])
    kw = dict(distance="inner_product")
    assert mean_average_precision([[1.0]], gallery, [0], gl, **kw) == pytest.approx(
        (1 / 1 + 2 / 3 + 3 / 6) / 3)
    assert map_at_r([[1.0]], gallery, [0], gl, **kw) == pytest.approx((1 / 1 + 2 / 3) / 3)
    assert cmc([[1.0]], gallery, [0], gl, topk=(1, 2), **kw) == {1: 1.0, 2: 1.0}
    # Query of class 1: relevance [0, 1, 0, 1, 1, 0] -> first hit at rank 2.
    assert cmc([[1.0]], gallery, [1], gl, topk=(1, 2), **kw) == {1: 0.0, 2: 1.0}
    assert mean_average_precision([[1.0]], gallery, [1], gl, **kw) == pytest.approx(
        (1 / 2 + 2 / 4 + 3 / 5) / 3)


def test_hand_built_tie():
    # Item 0 (wrong class) and item 1 (right class) tie at score 2: the match is ranked second.
    gallery = np.array([[2.0], [2.0], [1.0]])
    gl = np.array([1, 0, 0])
    kw = dict(distance="inner_product")
    assert cmc([[1.0]], gallery, [0], gl, topk=(1, 2), **kw) == {1: 0.0, 2: 1.0}
    assert mean_average_precision([[1.0]], gallery, [0], gl, **kw) == pytest.approx(
        (1 / 2 + 2 / 3) / 2)
    # Degenerate features (all equal) give 0 top-1, not 1.
    flat = np.ones((5, 3))
    assert cmc(flat, flat, [0, 0, 1, 1, 2], [0, 0, 1, 1, 2], topk=(1,))[1] == 0.0


def test_torch_inputs_and_string_labels():
    rng = np.random.default_rng(3)
    q, g = rng.normal(size=(10, 4)), rng.normal(size=(20, 4))
    ql, gl = rng.integers(0, 3, 10), rng.integers(0, 3, 20)
    names = np.array(["cat", "dog", "eel"])
    want = cmc(q, g, ql, gl)
    assert cmc(torch.from_numpy(q), torch.from_numpy(g), torch.from_numpy(ql),
               torch.from_numpy(gl)) == want
    assert cmc(q, g, names[ql], names[gl]) == want


def test_queries_without_a_match_are_skipped_with_a_warning(caplog):
    rng = np.random.default_rng(4)
    q, g = rng.normal(size=(12, 4)), rng.normal(size=(20, 4))
    ql, gl = rng.integers(0, 4, 12), rng.integers(0, 3, 20)  # class 3 never in the gallery
    assert (ql == 3).any()
    with caplog.at_level(logging.WARNING):
        got = mean_average_precision(q, g, ql, gl)
    assert "have no matching gallery item" in caplog.text
    assert got == pytest.approx(_naive_metrics(q, g, ql, gl)[1])
    assert cmc(q, g, ql, gl) == pytest.approx(_naive_metrics(q, g, ql, gl)[0])
    with pytest.raises(ValueError, match="no query has a matching gallery item"):
        cmc(q, g, np.full(12, 9), gl)


def test_bad_inputs():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(8, 4)), rng.integers(0, 2, 8)
    with pytest.raises(ValueError, match="query_labels must have shape"):
        cmc(x, x, y[:5], y)
    with pytest.raises(ValueError, match="query width 3 != gallery width 4"):
        cmc(x[:, :3], x, y, y)
    bad = x.copy()
    bad[6, 1] = np.nan
    with pytest.raises(ValueError, match="gallery.*row 6"):
        mean_average_precision(x, bad, y, y)
    with pytest.raises(ValueError, match="8 queries and 5 gallery items"):
        cmc(x, x[:5], y, y[:5], exclude_self=True)
    with pytest.raises(ValueError, match="labels differ at row"):
        cmc(x, x, y, 1 - y, exclude_self=True)
    with pytest.raises(ValueError, match="topk must be positive"):
        cmc(x, x, y, y, topk=(0, 1))
    with pytest.raises(KeyError, match="valid names"):
        cmc(x, x, y, y, distance="hamming")


# ---------------------------------------------------------------- template identification


def _naive_templates(q, ql, g, gl, topk, normalize_features=True):
    templates, labels = [], sorted(set(gl.tolist()))
    for c in labels:
        members = [f / np.linalg.norm(f) if normalize_features else f
                   for f, lab in zip(g, gl, strict=True) if lab == c]
        mean = np.mean(members, axis=0)
        templates.append(mean / np.linalg.norm(mean))
    hits = {k: 0 for k in topk}
    for f, lab in zip(q, ql, strict=True):
        scores = [f @ t for t in templates]
        own = scores[labels.index(lab)] if lab in labels else None
        rank = (1 + sum(s >= own for s, c in zip(scores, labels, strict=True) if c != lab)
                if own is not None else np.inf)
        for k in topk:
            hits[k] += rank <= k
    return {k: v / len(q) for k, v in hits.items()}


@pytest.mark.parametrize("normalize_features", [True, False])
def test_template_identification_matches_naive(normalize_features):
    rng = np.random.default_rng(6)
    g, gl = rng.normal(size=(60, 5)) * rng.uniform(0.5, 3, (60, 1)), rng.integers(0, 8, 60)
    q, ql = rng.normal(size=(25, 5)), rng.integers(0, 9, 25)  # class 8 has no template
    got = template_identification(q, ql, g, gl, topk=(1, 3), chunk_size=6,
                                  normalize_features=normalize_features)
    assert got == pytest.approx(_naive_templates(q, ql, g, gl, (1, 3), normalize_features))


def test_template_identification_hand_built():
    # Class A: [4, 0] and [0, 1]. Normalised first -> template [.707, .707]; raw mean [2, .5] ->
    # template [.970, .243]. Class B: one feature along [.85, .527]. Query [1, 0] of class A
    # scores .707 vs .85 (miss) with normalised features, .970 vs .85 (hit) with raw ones.
    gallery = np.array([[4.0, 0.0], [0.0, 1.0], [0.85, 0.527]])
    labels = np.array(["A", "A", "B"])
    query = np.array([[1.0, 0.0]])
    assert template_identification(query, ["A"], gallery, labels, topk=(1, 2)) == {1: 0.0,
                                                                                   2: 1.0}
    assert template_identification(query, ["A"], gallery, labels,
                                   normalize_features=False) == {1: 1.0}
    # A query whose class has no template is a miss even at k beyond the template count.
    assert template_identification(query, ["C"], gallery, labels, topk=(5,)) == {5: 0.0}


# ---------------------------------------------------------------- linear CKA


def _naive_cka(x: np.ndarray, y: np.ndarray) -> float:
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n

    def hsic(k, m):
        return np.trace(k @ h @ m @ h) / (n - 1) ** 2

    k, m = x @ x.T, y @ y.T
    return hsic(k, m) / np.sqrt(hsic(k, k) * hsic(m, m))


def test_linear_cka_against_naive_hsic_and_invariances():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(40, 6))
    y = x[:, :3] @ rng.normal(size=(3, 4)) + 0.5 * rng.normal(size=(40, 4))
    assert linear_cka(x, y) == pytest.approx(_naive_cka(x, y), rel=1e-10)
    assert 0.0 < linear_cka(x, y) < 1.0
    assert linear_cka(x, x) == pytest.approx(1.0)
    rotation, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    assert linear_cka(x @ rotation * 7.5, y) == pytest.approx(linear_cka(x, y), rel=1e-10)
    assert linear_cka(x + 3.0, y) == pytest.approx(linear_cka(x, y), rel=1e-10)
    assert linear_cka(torch.from_numpy(x).float(), y) == pytest.approx(linear_cka(x, y),
                                                                       rel=1e-5)


def test_linear_cka_bad_inputs():
    x = np.random.default_rng(8).normal(size=(10, 3))
    with pytest.raises(ValueError, match="same examples"):
        linear_cka(x, x[:9])
    with pytest.raises(ValueError, match="y is constant"):
        linear_cka(x, np.full((10, 2), 0.1))
    with pytest.raises(ValueError, match="at least 2"):
        linear_cka(x[:1], x[:1])
