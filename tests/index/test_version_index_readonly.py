"""Readers never write (``open_search_index``, ``exact_version_index`` in
``raycompat/index/version_index.py``; issue 23, item 6): without a published index a small
version is searched exactly in memory, a large one is refused naming ``raycompat index build``."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.index.version_index import (
    IndexNeededError,
    exact_version_index,
    open_search_index,
)
from raycompat.store import GalleryStore, VersionInfo, embedding_table

pytestmark = pytest.mark.usefixtures("one_faiss_thread")


@pytest.fixture
def store(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    x = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    staging = store.begin("g", VersionInfo("v1", "m1", 4, False, "v1 = extract(m1)"))
    staging.write_table(embedding_table(np.arange(30), x), "p.parquet")
    staging.commit(expected_rows=30)
    return store, x


def test_exact_version_index_searches_every_row_in_memory(store):
    store, x = store
    index = exact_version_index(store, "g", "v1")
    scores, ids = index.search(x[[4, 17]], 1)
    assert ids.ravel().tolist() == [4, 17] and index.index.kind == "flat"
    assert store.filesystem.get_file_info(store.path("g", "_index")).type.name == "NotFound"


def test_without_an_index_a_version_above_the_limit_is_refused(store):
    store, x = store
    index, note = open_search_index(store, "g", "v1", exact_max_rows=30, use_gpu=False)
    assert index.index.ntotal == 30 and "searched its 30 rows exactly" in note
    with pytest.raises(IndexNeededError) as error:
        open_search_index(store, "g", "v1", exact_max_rows=29, use_gpu=False)
    message = str(error.value)
    assert "its 30 rows exceed the 29 an exact search reads" in message
    assert message.endswith(f"raycompat index build g --version v1 --store {store.uri()}")
    assert "\n" not in message
