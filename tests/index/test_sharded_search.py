"""Searching a loaded ``sharded_ivf`` build: no read-ahead threads per call, and the same ids
as faiss reading the same files (issue 24, item 1; benchmarks/search_latency.py times it)."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np

from raycompat.index.stdout import stdout_to_stderr
from raycompat.index.version_index import build_version_index, load_version_index
from raycompat.store import GalleryStore, VersionInfo, embedding_table

ROWS, WIDTH = 1000, 8


def test_a_loaded_build_has_no_read_ahead_and_answers_as_faiss_does(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    x = np.random.default_rng(0).normal(size=(ROWS, WIDTH)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(ROWS, dtype=np.int64) * 5 + 1
    staging = store.begin("g", VersionInfo("v1", "m1", WIDTH, True, "v1 = extract(m1)"))
    staging.write_table(embedding_table(ids, x), "p.parquet")
    staging.commit(expected_rows=ROWS)
    build_version_index(store, "g", "v1", kind="sharded_ivf", nlist=8, use_gpu=False)
    index = load_version_index(store, "g", "v1", use_gpu=False)
    lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index.index.index).invlists)
    assert isinstance(lists, faiss.OnDiskInvertedLists) and lists.prefetch_nthread == 0

    pointer = json.loads(Path(store.path("g", "_index", "v1.json")).read_text())
    folder = Path(store.path("g", "_index", "v1", pointer["build"]))
    with stdout_to_stderr():
        plain = faiss.read_index(str(folder / "index.faiss"), faiss.IO_FLAG_ONDISK_SAME_DIR)
    plain.nprobe = index.index.index.nprobe
    queries = x[:20] + 0.01
    _, rows = plain.search(queries / np.linalg.norm(queries, axis=1, keepdims=True), 5)
    hits = index.hits(queries, 5)
    np.testing.assert_array_equal(np.stack([found for _, found in hits]), ids[rows])
    single = index.hits(queries[:1], 5)  # a batch of one: same answer
    np.testing.assert_array_equal(single[0][1], hits[0][1])
