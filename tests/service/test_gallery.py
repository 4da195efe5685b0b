"""A gallery handle (``raycompat/service/gallery.py``, issue 53 item 1 and issue 52 item 5b):
it answers what the one-shot ``search`` answers, from an index loaded once; it follows a
promote, a rollback, an alias set, a revoke and an index built after it opened, with the
service's own code; it prints nothing per search; and it closes.

The store is ``conftest.py``'s: gallery g, v1..v4 of 20 rows of width 4 (l2, unindexed), m1,
m2 and m3 granted v1."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

from raycompat import Gallery, open_gallery
from raycompat.index.version_index import build_version_index
from raycompat.service import GalleryClosedError, NotServedError
from raycompat.service.requests import AliasMovedError
from raycompat.serving import aliases, search
from raycompat.serving.query_inputs import QueryError
from raycompat.serving.served_log import promote, revoke, rollback
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

pytestmark = pytest.mark.usefixtures("one_faiss_thread")

Q = np.random.default_rng(0).random((3, 4)).astype(np.float32)


def same_answer(ours, theirs) -> None:
    """Two SearchResults equal in every field, hit by hit."""
    assert (ours.gallery, ours.version, ours.index, ours.metric, ours.model, ours.notes) == (
        theirs.gallery, theirs.version, theirs.index, theirs.metric, theirs.model, theirs.notes,
    )  # fmt: skip
    assert len(ours.hits) == len(theirs.hits)
    for mine, expected in zip(ours.hits, theirs.hits, strict=True):
        assert mine.ids.tolist() == expected.ids.tolist()
        np.testing.assert_array_equal(mine.scores, expected.scores)
        assert mine.labels == expected.labels


@pytest.fixture
def labelled(tmp_path) -> GalleryStore:
    """Gallery ``l``: 300 unit rows of width 8, int64 ids, labels ``id % 7``,
    model m1 granted it."""
    store = GalleryStore(str(tmp_path / "labelled"))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = rng.permutation(1000)[:300].astype(np.int64)  # not in store order
    labels = ids % 7
    staging = store.begin("l", VersionInfo("v1", "m1", 8, True, "v1 = extract(m1)"))
    staging.write_table(embedding_table(ids, x, labels=labels), "p.parquet")
    staging.commit(expected_rows=300)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", "", 8, method="independent"))
    catalog.grant(QueryGrant("l", "v1", "m1", "extracted"))
    return store


@pytest.mark.parametrize("indexed", [False, True], ids=["exact", "flat build"])
def test_a_handle_answers_what_search_answers(labelled, indexed):
    if indexed:
        build_version_index(labelled, "l", "v1", use_gpu=False)
    queries = np.random.default_rng(2).normal(size=(4, 8)).astype(np.float32)
    stored = [str(i) for i in next(labelled.iter_batches("l", "v1", 5, ["id"])).column("id")]
    with open_gallery(labelled, "l", model="m1", poll_s=None) as gallery:
        for asked in ({"vectors": queries}, {"ids": stored}):
            same_answer(gallery.search(**asked, k=6), search(labelled, "l", "m1", **asked, k=6))
        result = gallery.search(vectors=queries, k=6)
    assert any(label is not None for hits in result.hits for label in hits.labels)


def test_a_handle_answers_from_a_query_file_as_search_does(labelled, tmp_path):
    path = str(tmp_path / "q.npy")
    np.save(path, np.random.default_rng(3).normal(size=(2, 8)).astype(np.float32))
    seen: list[str] = []
    with open_gallery(labelled, "l", model="m1", poll_s=None) as gallery:
        ours = gallery.search(vectors=path, k=3, on_note=seen.append)
    same_answer(ours, search(labelled, "l", "m1", vectors=path, k=3))
    assert seen == ours.notes and "searched its 300 rows exactly" in seen[0]


def test_it_follows_a_promote_a_rollback_and_a_revoke_at_each_refresh(store):
    with open_gallery(store, "g", model="m2", poll_s=None) as gallery:
        assert gallery.search(vectors=Q, k=2).version == "v1"
        promote(store, "g", "m2", "v3")
        assert gallery.search(vectors=Q, k=2).version == "v1"  # until it follows
        gallery.refresh()
        result = gallery.search(vectors=Q, k=2)
        assert result.version == "v3" and result.hits[0].ids[0].startswith("v3-")
        rollback(store, "g", "m2")
        gallery.refresh()
        assert gallery.describe()["version"] == "v1"
        revoke(store, "g", "m2")
        gallery.refresh()
        with pytest.raises(NotServedError, match="'m2' may not query gallery 'g': revoked at"):
            gallery.search(vectors=Q, k=2)
        assert "revoked at" in repr(gallery)
        rollback(store, "g", "m2")
        gallery.refresh()
        assert gallery.search(vectors=Q, k=2).version == "v1"


def test_checking_each_search_follows_without_a_refresh(store):
    with open_gallery(store, "g", model="m2", poll_s=None, check_each_search=True) as gallery:
        promote(store, "g", "m2", "v2")
        assert gallery.search(vectors=Q, k=2).version == "v2"


def test_the_watcher_follows_a_promote_by_itself(store):
    with open_gallery(store, "g", model="m2", poll_s=0.02) as gallery:
        promote(store, "g", "m2", "v3")
        assert wait_for(lambda: gallery.describe()["version"] == "v3")


def test_a_named_alias_is_followed_and_its_model_checked(store):
    aliases.set_alias(store, "g", "prod", "v1", "m1")
    with open_gallery(store, "g", alias="prod", poll_s=None) as gallery:
        assert gallery.describe() == {
            "gallery": "g", "model": "m1", "alias": "prod", "version": "v1", "index": "exact",
            "metric": "negative squared L2",
        }  # fmt: skip
        aliases.set_alias(store, "g", "prod", "v3", "m2")
        gallery.refresh()
        result = gallery.search(vectors=Q, k=2)
        assert (result.version, result.model) == ("v3", "m2")
    with open_gallery(store, "g", alias="prod", model="m2", poll_s=None) as gallery:
        assert gallery.search(vectors=Q, k=1).version == "v3"
        aliases.rollback(store, "g", "prod")  # back to (v1, m1): m2's vectors refused
        gallery.refresh()
        with pytest.raises(AliasMovedError, match="searched by model m1 now, not model m2"):
            gallery.search(vectors=Q, k=1)


def test_an_index_built_after_it_opened_is_followed_at_the_next_poll(store):
    with open_gallery(store, "g", model="m1", poll_s=None) as gallery:
        exact = gallery.search(vectors=Q, k=3)
        assert exact.index == "exact" and exact.notes
        first = gallery.loaded()
        gallery.refresh()
        assert gallery.loaded() is first  # nothing changed: no reload
        build = build_version_index(store, "g", "v1", use_gpu=False).rsplit("/", 1)[-1]
        assert gallery.search(vectors=Q, k=3).index == "exact"  # until the poll
        gallery.refresh()
        built = gallery.search(vectors=Q, k=3)
        assert (built.index, built.notes) == (f"build {build}", [])
        assert [h.ids.tolist() for h in built.hits] == [h.ids.tolist() for h in exact.hits]
        followed = gallery.loaded()
        gallery.refresh()
        assert gallery.loaded() is followed
        rebuilt = build_version_index(store, "g", "v1", use_gpu=False).rsplit("/", 1)[-1]
        gallery.refresh()
        assert gallery.describe()["index"] == f"build {rebuilt}" != f"build {build}"


def test_the_watcher_follows_a_new_index_by_itself(store):
    with open_gallery(store, "g", model="m1", poll_s=0.02) as gallery:
        build_version_index(store, "g", "v1", use_gpu=False)
        assert wait_for(lambda: gallery.describe()["index"].startswith("build "))


def test_nothing_is_printed_per_search(store, capfd):
    build_version_index(store, "g", "v1", use_gpu=False)
    with open_gallery(store, "g", model="m1", poll_s=None) as gallery:
        capfd.readouterr()
        for _ in range(3):
            gallery.search(vectors=Q, k=2)
            gallery.search(ids=["v1-0"], k=2)
        assert capfd.readouterr() == ("", "")


def test_a_closed_handle_refuses_searches_and_stops_its_watcher(store):
    gallery = open_gallery(store, "g", model="m1", poll_s=0.02)
    thread = gallery._watcher._thread
    with gallery:
        assert thread.is_alive()
    assert not thread.is_alive()
    with pytest.raises(GalleryClosedError, match="gallery handle g/m1 is closed"):
        gallery.search(vectors=Q, k=1)
    gallery.close()  # twice: nothing
    assert repr(gallery) == "Gallery(g/m1: gallery handle g/m1 is closed)"


def test_a_handle_dropped_unclosed_stops_its_watcher(store):
    gallery = open_gallery(store, "g", model="m1", poll_s=0.02)
    thread = gallery._watcher._thread
    del gallery
    gc.collect()
    assert wait_for(lambda: not thread.is_alive())


def test_errors_name_the_gallery_and_the_model_or_alias(store):
    with pytest.raises(QueryError, match=r"open_gallery\('g'\) needs model= or alias="):
        open_gallery(store, "g")
    with pytest.raises(Exception, match="model 'm9' is not registered .* models are m1, m2, m3"):
        open_gallery(store, "g", model="m9")
    with pytest.raises(Exception, match="no gallery 'h' .*: galleries are g"):
        open_gallery(store, "h", model="m1")
    with pytest.raises(Exception, match="gallery 'g' has no alias 'prod'"):
        open_gallery(store, "g", alias="prod")
    revoke(store, "g", "m2")
    with pytest.raises(Exception, match="'m2' may not query gallery 'g': revoked at"):
        open_gallery(store, "g", model="m2")


def test_the_handle_is_one_public_name(store):
    import raycompat
    import raycompat.service

    assert raycompat.open_gallery is raycompat.service.open_gallery
    assert isinstance(open_gallery(store, "g", model="m1", poll_s=None), Gallery)


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False
