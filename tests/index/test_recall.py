"""recall@k of a version's index against exact search (``raycompat/index/recall.py``): the
streamed exact top-k equals a brute-force reference, and an exact index scores 1."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.index.recall import estimate_recall, exact_top_k
from raycompat.index.version_index import build_version_index, load_version_index
from raycompat.store import GalleryStore, VersionInfo, embedding_table

pytestmark = pytest.mark.usefixtures("one_faiss_thread")


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """An l2 (not normalized) version of 300 rows with int64 ids ``1000 + row``, 3 part
    files, and its flat index."""
    store = GalleryStore(str(tmp_path_factory.mktemp("recall") / "store"))
    x = np.random.default_rng(1).normal(size=(300, 6)).astype(np.float32)
    staging = store.begin("g", VersionInfo("v1", "m1", 6, False, "v1 = extract(m1)"))
    for p in range(3):
        rows = slice(100 * p, 100 * (p + 1))
        staging.write_table(embedding_table(np.arange(300)[rows] + 1000, x[rows]), f"p{p}.parquet")
    staging.commit(expected_rows=300)
    build_version_index(store, "g", "v1", use_gpu=False)
    return store, x, load_version_index(store, "g", "v1", use_gpu=False)


def test_streamed_exact_top_k_equals_brute_force(indexed):
    store, x, index = indexed
    queries = np.random.default_rng(2).normal(size=(7, 6)).astype(np.float32)
    scores, ids = exact_top_k(store, "g", index, queries, k=10, batch_size=64)  # 5 batches
    d2 = ((queries[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    order = np.argsort(d2, axis=1)[:, :10]
    np.testing.assert_array_equal(ids, order + 1000)
    np.testing.assert_allclose(scores, -np.take_along_axis(d2, order, axis=1), rtol=1e-4)


def test_an_exact_index_has_recall_one_on_sampled_rows(indexed):
    store, _, index = indexed
    assert estimate_recall(store, "g", index, queries=40, batch_size=64) == {
        "recall": 1.0,
        "queries": 40,
        "k": 10,
    }
    assert estimate_recall(store, "g", index, queries=1000, k=500)["queries"] == 300  # capped
