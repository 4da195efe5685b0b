"""Integrity of the per-version faiss index: checksummed builds, corrupt files detected before
faiss reads them, rebuild on demand, old pointers, and zero-norm queries on cosine indexes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import faiss
import numpy as np
import pytest

from raycompat.index.distances import ZeroNormError
from raycompat.index.factory import build_index
from raycompat.index.version_index import (
    build_version_index,
    load_version_index,
    open_version_index,
)
from raycompat.store import (
    CorruptFileError,
    CorruptIndexError,
    GalleryStore,
    MissingIndexError,
    VersionInfo,
    embedding_table,
)
from tests.store.test_gallery import unit_rows

pytestmark = pytest.mark.usefixtures("one_faiss_thread")


@pytest.fixture
def indexed(tmp_path) -> tuple[GalleryStore, np.ndarray]:
    """A normalized (cosine) 200 x 8 version ``g/v1`` with its index built."""
    store = GalleryStore(str(tmp_path / "store"))
    x = unit_rows(200, 8)
    staging = store.begin("g", VersionInfo("v1", "m1", 8, True, "v1 = extract(m1)"))
    staging.write_table(embedding_table([f"i{k}" for k in range(200)], x), "p.parquet")
    staging.commit(expected_rows=200)
    build_version_index(store, "g", "v1", use_gpu=False)
    return store, x


def pointer_path(store: GalleryStore) -> Path:
    return Path(store.path("g", "_index", "v1.json"))


def build_file(store: GalleryStore, name: str) -> Path:
    build = json.loads(pointer_path(store).read_text())["build"]
    return Path(store.path("g", "_index", "v1", build, name))


def truncate(path: Path) -> int:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return len(data)


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 5] ^= 0x01  # inside the stored vectors: faiss would read it without error
    path.write_bytes(bytes(data))


def test_pointer_records_size_and_sha256_of_every_file(indexed):
    store, _ = indexed
    files = json.loads(pointer_path(store).read_text())["files"]
    assert sorted(files) == ["ids.parquet", "index.faiss", "index.faiss.json"]
    for name, record in files.items():
        assert record["bytes"] == build_file(store, name).stat().st_size
        assert len(record["sha256"]) == 64


def test_truncated_index_is_detected_naming_the_file(indexed):
    store, _ = indexed
    path = build_file(store, "index.faiss")
    size = truncate(path)
    expected = f"{path}: expected {size} bytes, found {size // 2}"
    with pytest.raises(CorruptIndexError, match=expected):
        load_version_index(store, "g", "v1", use_gpu=False)


def test_bit_flipped_index_is_detected_before_faiss_reads_it(indexed):
    store, _ = indexed
    path = build_file(store, "index.faiss")
    flip_bit(path)
    faiss.read_index(str(path))  # faiss itself would have searched it
    with pytest.raises(CorruptIndexError, match=f"{path}: expected sha256 [0-9a-f]{{64}}, found"):
        load_version_index(store, "g", "v1", use_gpu=False)


def test_corrupt_ids_file_is_detected(indexed):
    store, _ = indexed
    path = build_file(store, "ids.parquet")
    flip_bit(path)
    with pytest.raises(CorruptIndexError, match="ids.parquet: expected sha256"):
        load_version_index(store, "g", "v1", use_gpu=False)


def test_rebuild_on_corrupt_equals_a_fresh_index(indexed, caplog):
    store, x = indexed
    queries = unit_rows(9, 8, seed=3)
    fresh = load_version_index(store, "g", "v1", use_gpu=False).search(queries, 5)
    path = build_file(store, "index.faiss")
    truncate(path)
    with pytest.raises(CorruptIndexError, match="index.faiss"):
        open_version_index(store, "g", "v1", rebuild=False, use_gpu=False)
    with caplog.at_level(logging.WARNING, logger="raycompat.index.version_index"):
        rebuilt = open_version_index(store, "g", "v1", rebuild=True, use_gpu=False)
    assert any(str(path) in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert build_file(store, "index.faiss") != path  # a new build, the pointer moved
    scores, ids = rebuilt.search(queries, 5)
    np.testing.assert_array_equal(ids, fresh[1])
    np.testing.assert_allclose(scores, fresh[0], rtol=1e-6)


def test_missing_index_is_built_only_when_allowed(indexed):
    store, x = indexed
    pointer_path(store).unlink()
    with pytest.raises(MissingIndexError, match="no index for g/v1"):
        open_version_index(store, "g", "v1", rebuild=False, use_gpu=False)
    index = open_version_index(store, "g", "v1", rebuild=True, use_gpu=False)
    assert index.search(x[[4]], 1)[1].tolist() == [["i4"]]


def test_unreadable_pointer_or_missing_build_file(indexed):
    store, _ = indexed
    path = build_file(store, "ids.parquet")
    path.unlink()
    with pytest.raises(CorruptIndexError, match=f"{path}: missing"):
        load_version_index(store, "g", "v1", use_gpu=False)
    pointer_path(store).write_text('{"build": "x", "files": {"index.faiss": 3}}')
    with pytest.raises(CorruptFileError, match="v1.json: unreadable index pointer"):
        load_version_index(store, "g", "v1", use_gpu=False)


def test_pointer_without_checksums_loads_unverified_and_parse_errors_are_store_errors(
    indexed, caplog
):
    """Pointers written before checksums existed still load (with a warning); a file faiss
    cannot parse is then a CorruptIndexError, not faiss' RuntimeError."""
    store, x = indexed
    pointer = json.loads(pointer_path(store).read_text())
    del pointer["files"]
    pointer_path(store).write_text(json.dumps(pointer))
    with caplog.at_level(logging.WARNING, logger="raycompat.index.version_index"):
        index = load_version_index(store, "g", "v1", use_gpu=False)
    assert "records no checksums" in caplog.text
    assert index.search(x[[7]], 1)[1].tolist() == [["i7"]]
    path = build_file(store, "index.faiss")
    truncate(path)
    with pytest.raises(CorruptIndexError, match=f"{path}.*faiss cannot read it"):
        load_version_index(store, "g", "v1", use_gpu=False)


def test_zero_query_is_refused_on_cosine_and_answered_on_l2(indexed):
    store, x = indexed
    index = load_version_index(store, "g", "v1", use_gpu=False)
    queries = np.stack([x[0], np.zeros(8, np.float32), x[1], np.full(8, 1e-14, np.float32)])
    with pytest.raises(ZeroNormError, match=r"queries has 2 row\(s\) with zero norm.*1, 3") as err:
        index.search(queries, 3)
    assert err.value.rows == [1, 3] and isinstance(err.value, ValueError)
    l2 = build_index(x, "l2", use_gpu=False)
    scores, rows = l2.search(np.zeros((1, 8), np.float32), 3)
    np.testing.assert_allclose(scores, -1.0, atol=1e-5)  # unit gallery: ||0 - g||^2 = 1
    assert (rows >= 0).all()


@pytest.mark.parametrize("int_ids", [False, True])
def test_a_flat_index_gives_its_rows_vectors_by_id_as_stored(tmp_path, int_ids):
    """What the service answers ``ids`` queries from (no scan of the files): the rows' vectors
    in the order asked, and the ids no row holds."""
    store = GalleryStore(str(tmp_path / "store"))
    x = unit_rows(50, 8)
    ids = [7 * k + 3 for k in range(50)] if int_ids else [f"i{k}" for k in range(50)]
    staging = store.begin("g", VersionInfo("v1", "m1", 8, True, "v1 = extract(m1)"))
    staging.write_table(embedding_table(ids, x), "p.parquet")
    staging.commit(expected_rows=50)
    build_version_index(store, "g", "v1", kind="flat", use_gpu=False)
    index = load_version_index(store, "g", "v1", use_gpu=False)
    assert index.holds_vectors()
    order = np.argsort(index.ids, kind="stable")
    found, missing = index.vectors_of([ids[9], ids[0], ids[9]], order)
    np.testing.assert_allclose(found, x[[9, 0, 9]], atol=1e-6)
    assert missing == []
    absent = 4 if int_ids else "nope"  # 4 falls between stored ids 3 and 10
    assert index.vectors_of([ids[1], absent], order) == (None, [absent])
