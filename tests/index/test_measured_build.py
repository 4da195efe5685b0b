"""Publishing an index after measuring it (``raycompat/index/measured_build.py``, issue 40,
item 9): the recall goes into the pointer, a better published index is kept unless forced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raycompat.index.measured_build import WorseIndexError, build_measured_index
from raycompat.index.version_index import build_version_index
from raycompat.store import GalleryStore, VersionInfo, embedding_table

pytestmark = pytest.mark.usefixtures("one_faiss_thread")
LOSSY = {"kind": "ivfpq", "nlist": 16, "nprobe": 1, "use_gpu": False}  # 1 of 16 lists visited


@pytest.fixture
def store(tmp_path) -> GalleryStore:
    """g/v1: 400 unit rows of width 8."""
    store = GalleryStore(str(tmp_path / "store"))
    x = np.random.default_rng(0).normal(size=(400, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    staging = store.begin("g", VersionInfo("v1", "m1", 8, True, "v1 = extract(m1)"))
    staging.write_table(embedding_table([f"r{i}" for i in range(400)], x), "part-0.parquet")
    staging.commit(expected_rows=400)
    return store


def pointer(store: GalleryStore) -> dict:
    return json.loads(Path(store.uri(), "g", "_index", "v1.json").read_text())


def builds(store: GalleryStore) -> set[str]:
    return {p.name for p in Path(store.uri(), "g", "_index", "v1").iterdir()}


def test_the_measured_recall_is_recorded_in_the_pointer(store):
    built = build_measured_index(store, "g", "v1", kind="flat", queries=50, use_gpu=False)
    assert built.recall == {"recall": 1.0, "k": 10, "queries": 50, "seed": 0}
    assert built.previous is None and built.kind == "flat"
    assert pointer(store)["recall"] == built.recall
    assert built.uri.endswith(pointer(store)["build"])


def test_a_worse_build_is_refused_and_force_replaces(store):
    """The published flat index records no recall (``build_version_index``): it is measured
    on the same sample, 1.0; the lossy IVF-PQ is refused, its folder removed, the pointer kept."""
    build_version_index(store, "g", "v1", kind="flat", use_gpu=False)
    before, folders = pointer(store), builds(store)
    with pytest.raises(WorseIndexError) as caught:
        build_measured_index(store, "g", "v1", **LOSSY)
    message = str(caught.value)
    assert "g/v1: the new ivfpq index measures recall@10 0." in message
    assert "below the published flat index's 1.0000" in message and "--force" in message
    assert pointer(store) == before and builds(store) == folders
    built = build_measured_index(store, "g", "v1", force=True, **LOSSY)
    assert built.previous == 1.0 and built.recall["recall"] < 0.9
    assert pointer(store)["build"] != before["build"] and pointer(store)["kind"] == "ivfpq"


def test_a_better_or_equal_build_replaces_without_force(store):
    lossy = build_measured_index(store, "g", "v1", **LOSSY)
    again = build_measured_index(store, "g", "v1", **LOSSY)  # seeded: the same recall
    assert again.previous == lossy.recall["recall"] == again.recall["recall"]
    exact = build_measured_index(store, "g", "v1", kind="flat", use_gpu=False)
    assert exact.previous == lossy.recall["recall"] and exact.recall["recall"] == 1.0


def test_a_corrupt_published_index_is_replaced(store):
    build_version_index(store, "g", "v1", kind="flat", use_gpu=False)
    faiss_file = next(Path(store.uri(), "g", "_index", "v1").glob("*/index.faiss"))
    faiss_file.write_bytes(faiss_file.read_bytes()[:-4])
    built = build_measured_index(store, "g", "v1", **LOSSY)
    assert built.previous is None and pointer(store)["kind"] == "ivfpq"
