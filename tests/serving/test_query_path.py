"""The query path in the core (``raycompat/serving/``: ``query_path.py``, ``query_inputs.py``,
``ranking.py``, ``resolve.py``): zero-padding of a narrower query model, query files checked
against the model's width, hits as gallery ids with their stored labels, and the served version
of a model (issue 39, "the query path in the core").

The gallery is three one-hot rows, so every expected hit and score is read off by hand."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.serving.query_inputs import QueryError, read_query_vectors
from raycompat.serving.query_path import search, search_gallery
from raycompat.serving.ranking import to_width
from raycompat.serving.resolve import served_version
from raycompat.serving.stored_rows import stored_vectors
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

pytestmark = pytest.mark.usefixtures("one_faiss_thread")

ONE_HOT = np.eye(3, dtype=np.float32)  # row i is the unit vector e_i


@pytest.fixture
def store(tmp_path):
    """Gallery ``g``: v1 holds ids a, b, c at e_0, e_1, e_2 with labels 10, 20, 30 (model m1,
    width 3, granted to m1); v2 holds ids 7, 8 (int64), unlabelled."""
    store = GalleryStore(str(tmp_path / "store"))
    staging = store.begin("g", VersionInfo("v1", "m1", 3, True, "v1 = extract(m1)"))
    staging.write_table(embedding_table(["a", "b", "c"], ONE_HOT, labels=[10, 20, 30]), "p.parquet")
    staging.commit(expected_rows=3)
    staging = store.begin("g", VersionInfo("v2", "m1", 3, True, "v2 = extract(m1)"))
    staging.write_table(embedding_table(np.array([7, 8]), ONE_HOT[:2]), "p.parquet")
    staging.commit(expected_rows=2)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", str(tmp_path / "m1"), 3, method="independent"))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted"))
    return store


def test_a_narrower_query_is_zero_padded_and_a_wider_one_cut_to_the_gallerys_width():
    assert to_width(np.array([[1, 2]]), 3).tolist() == [[1.0, 2.0, 0.0]]
    assert to_width(np.array([[1, 2, 3, 4]]), 3).tolist() == [[1.0, 2.0, 3.0]]
    assert to_width(np.array([[1, 2, 3]]), 3).dtype == np.float32


def test_a_narrower_model_searches_on_the_shared_first_coordinates(store):
    # (0, 1) padded to (0, 1, 0) = e_1: id b first, score 1 (cosine)
    result = search_gallery(store, "g", np.array([[0.0, 1.0]]), 1, version="v1")
    (hits,) = result.hits
    assert hits.ids.tolist() == ["b"] and hits.scores.tolist() == pytest.approx([1.0])


def test_hits_are_gallery_ids_with_their_stored_labels_best_first(store):
    queries = np.array([[0.0, 0.0, 1.0], [1.0, 0.2, 0.0]], dtype=np.float32)
    result = search_gallery(store, "g", queries, 2, model="m1")
    assert (result.gallery, result.version) == ("g", "v1")  # m1's grant
    first, second = result.hits
    # e_2 is c (a and b tie at 0 behind it); (1, 0.2, 0) is nearest a, then b
    assert first.ids[0] == "c" and first.labels[0] == 30 and first.scores[0] == pytest.approx(1)
    assert second.ids.tolist() == ["a", "b"] and second.labels == [10, 20]
    assert "no index is published" in result.notes[0]  # searched exactly in memory


def test_int_ids_map_back_and_an_unlabelled_version_gives_none(store):
    result = search_gallery(store, "g", ONE_HOT[[1]], 1, version="v2")
    assert result.hits[0].ids.tolist() == [8] and result.hits[0].labels == [None]


def test_k_above_the_versions_rows_returns_every_row_and_a_note_on_the_note_callback(store):
    seen = []
    result = search_gallery(store, "g", ONE_HOT[[0]], 5, version="v1", on_note=seen.append)
    assert len(result.hits[0].ids) == 3
    assert seen == result.notes and result.notes[-1] == (
        "1 of 1 queries got fewer than -k 5 hits (fewest 3): version v1 holds 3 rows"
    )


def test_a_zero_query_on_a_cosine_version_names_the_query_and_the_model(store):
    from raycompat.index.distances import ZeroNormError

    with pytest.raises(ZeroNormError, match=r"query q2 is a zero vector for model m1"):
        search_gallery(
            store, "g", np.array([[1.0, 0, 0], [0, 0, 0]]), 1, model="m1", names=["q1", "q2"]
        )


def test_k_below_one_and_a_query_without_model_or_version_are_query_errors(store):
    with pytest.raises(QueryError, match=r"-k must be >= 1 \(hits per query\), got 0"):
        search_gallery(store, "g", ONE_HOT, 0, version="v1")
    with pytest.raises(QueryError, match="model or the gallery version"):
        search_gallery(store, "g", ONE_HOT, 1)


def test_a_query_file_of_the_wrong_width_is_a_query_error_naming_the_file(tmp_path):
    path = tmp_path / "q.npy"
    np.save(path, np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(QueryError) as error:
        read_query_vectors(str(path), 3)
    assert str(error.value) == (
        f"{path}: expected finite vectors of shape (Q, 3) for model width 3, got shape (2, 4)"
    )
    np.save(path, np.ones((2, 3), dtype=np.float64))
    assert read_query_vectors(str(path), 3).dtype == np.float32


def test_an_unreadable_query_file_is_a_query_error_naming_the_file(tmp_path):
    path = tmp_path / "q.npy"
    path.write_bytes(b"not numpy")
    with pytest.raises(QueryError, match=rf"^{path}: not a readable \.npy array"):
        read_query_vectors(str(path), 3)


def test_stored_vectors_come_back_in_query_order(store):
    assert stored_vectors(store, "g", "v1", ["c", "a"]).tolist() == ONE_HOT[[2, 0]].tolist()
    assert stored_vectors(store, "g", "v2", ["8"]).tolist() == ONE_HOT[[1]].tolist()


def test_served_version_is_the_models_grant(store):
    served = served_version(store, "g", "m1")
    assert (served.gallery_version, served.relation, served.source) == ("v1", "extracted", "grant")


def test_search_names_the_version_the_index_and_the_metric_of_its_scores(store):
    """``search``: the one entry of the CLI, the API and the service (issue 42, item 1)."""
    from raycompat.index.version_index import build_version_index

    exact = search(store, "g", "m1", vectors=ONE_HOT[[1]], k=1)
    assert (exact.version, exact.model, exact.index) == ("v1", "m1", "exact")
    assert exact.metric == "cosine similarity" and exact.hits[0].ids.tolist() == ["b"]
    build = build_version_index(store, "g", "v1", distance="l2", use_gpu=False)
    indexed = search(store, "g", "m1", ids=["c"], k=2)
    assert indexed.index == f"build {build.rsplit('/', 1)[-1]}"
    assert indexed.metric == "negative squared L2"
    assert indexed.hits[0].scores.tolist() == pytest.approx([0.0, -2.0])  # -||e_2 - e_j||^2
    assert search(store, "g", None, ids=["8"], k=1, version="v2").hits[0].ids.tolist() == [8]


@pytest.mark.parametrize(
    ("vectors", "message"),
    [
        (np.ones((2, 4)), r"shape \(Q, 3\), got shape \(2, 4\)"),
        (np.array([[1.0, 0, 0], [np.nan, 0, 0]]), "NaN or inf in row 1"),
    ],
)
def test_search_refuses_bad_vectors_naming_the_row_before_faiss_sees_them(store, vectors, message):
    with pytest.raises(QueryError, match=f"^vectors: .*{message}"):
        search(store, "g", "m1", vectors=vectors, k=1)
