"""The faiss query path of raycompat.index.search_index in NumPy: the same checks and scores as
torch's ``Distance.prepare``, and ``real_hits`` with and without faiss's padding (issue 24,
item 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raycompat.index.distances import ZeroNormError, get_distance
from raycompat.index.search_index import real_hits


@pytest.mark.parametrize("name", ["cosine", "l2", "inner_product"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_prepare_numpy_equals_the_torch_prepare(name, dtype):
    x = (np.random.default_rng(0).normal(size=(6, 5)) * 10).astype(dtype)
    dist = get_distance(name)
    got = dist.prepare_numpy(x, "queries", refuse_zero=True)
    want = dist.prepare(x, "queries", refuse_zero=True).numpy()
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)
    tensor = dist.prepare_numpy(torch.from_numpy(x).requires_grad_(dtype != np.int64), "q")
    np.testing.assert_allclose(tensor, dist.prepare_numpy(x, "q"))


@pytest.mark.parametrize(
    ("x", "error", "message"),
    [
        (np.zeros(3), ValueError, r"^queries must be a 2-D \(N, d\) matrix, got shape \(3,\)$"),
        (np.zeros((0, 3)), ValueError, r"^queries is empty: shape \(0, 3\)$"),
        (
            np.array([[1.0, 0], [np.nan, 1], [1, np.inf]]),
            ValueError,
            r"^queries has 2 row\(s\) with NaN/inf values; first is row 1$",
        ),
        (
            np.array([[1.0, 0], [0, 0], [1, 1], [0, 0]]),
            ZeroNormError,
            r"^queries has 2 row\(s\) with zero norm \(< 1e-12\), .*: row\(s\) 1, 3$",
        ),
    ],
)
def test_prepare_numpy_refuses_what_the_torch_prepare_refuses(x, error, message):
    dist = get_distance("cosine")
    for prepare in (dist.prepare, dist.prepare_numpy):
        with pytest.raises(error, match=message):
            prepare(x, "queries", refuse_zero=True)


def test_prepare_numpy_keeps_zero_gallery_rows_zero():
    x = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    np.testing.assert_allclose(get_distance("cosine").prepare_numpy(x), [[0.6, 0.8], [0, 0]])


def test_real_hits_with_and_without_padding():
    scores = np.array([[0.9, 0.5, 0.1], [0.8, -np.inf, -np.inf]], np.float32)
    rows = np.array([[2, 0, 1], [1, -1, -1]])
    ids = np.array([10, 11, -1])  # an int64 id -1 is a real hit
    (s0, i0), (s1, i1) = real_hits(scores, rows, ids)
    np.testing.assert_array_equal(i0, [-1, 10, 11])
    np.testing.assert_array_equal(s0, scores[0])
    np.testing.assert_array_equal(i1, [11])
    np.testing.assert_array_equal(s1, scores[1, :1])
    full = real_hits(scores[:1], rows[:1], ids)
    assert len(full) == 1 and full[0][1].tolist() == [-1, 10, 11]
    assert real_hits(scores[:1], rows[:1])[0][1].tolist() == [2, 0, 1]
