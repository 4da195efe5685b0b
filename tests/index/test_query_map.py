"""The query-side map a search runs (raycompat/index/query_map.py): the linear kinds through
faiss's LinearTransform, any other kind through its own torch map; both are the
transformation's forward on the queries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raycompat.index.query_map import FaissLinearMap, search_map
from raycompat.transformations import create_transformation


def fitted(kind: str, normalize_output: bool):
    torch.manual_seed(0)
    h = create_transformation(kind, d_old=5, d_side=0, d_new=3, normalize_output=normalize_output)
    if hasattr(h, "set_weights"):
        rng = np.random.default_rng(0)
        h.set_weights(rng.normal(size=(5, 3)), rng.normal(size=3))
    return h


@pytest.mark.parametrize("normalize_output", [False, True])
@pytest.mark.parametrize("kind, runs_in", [
    ("procrustes", FaissLinearMap), ("affine", FaissLinearMap), ("adapter", None)
])  # fmt: skip
def test_the_search_map_is_forward_on_the_queries(kind, runs_in, normalize_output):
    h = fitted(kind, normalize_output)
    queries = np.random.default_rng(1).normal(size=(4, 5))  # float64: converted
    with torch.no_grad():
        want = h(torch.from_numpy(queries.astype(np.float32))).numpy()
    mapped = search_map(h)
    assert isinstance(mapped, runs_in) if runs_in else mapped is h
    got = mapped.map_arrays(queries)
    assert got.dtype == np.float32 and got.shape == (4, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mapped.map_arrays(queries[:1]), want[:1], rtol=1e-5, atol=1e-6)
    if normalize_output:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("kind", ["procrustes", "adapter"])
def test_a_query_of_the_wrong_width_names_the_expected_shape(kind):
    mapped = search_map(fitted(kind, False))
    with pytest.raises(ValueError, match=r"shape \(N, 5\), got \(2, 4\)"):
        mapped.map_arrays(np.ones((2, 4), np.float32))
