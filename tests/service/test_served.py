"""What a replica serves follows the serving records: promote, rollback, revoke and retire are
followed before the next request, old indexes are freed once their last request ends, and each
swap is counted (issue 42, item 3)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from raycompat.service.routes import Route
from raycompat.service.served import NotServedError, Served, UnloadableError
from raycompat.serving import aliases
from raycompat.serving.ranking import ranked_hits
from raycompat.serving.served_log import promote, revoke, rollback
from raycompat.store.catalog.retired import retire
from tests.service.conftest import corrupt

Q = np.full((1, 4), 0.5, np.float32)


@pytest.fixture
def served(store) -> Served:
    served = Served(store)
    served.refresh()
    return served


def swaps(served: Served, model: str = "m2") -> float:
    return served.metrics.swaps.labels("g", model)._value.get()


def test_each_pair_of_the_store_is_loaded_with_what_its_records_serve(served):
    assert {m: d["version"] for m, d in served.listing()["model"]["g"].items()} == {
        "m1": "v1", "m2": "v1", "m3": "v1",
    }  # fmt: skip
    assert served.listing()["model"]["g"]["m2"] == {
        "version": "v1", "index": "exact", "metric": "negative squared L2",
    }  # fmt: skip


def test_a_promote_and_a_rollback_are_followed_before_the_next_request(served, store):
    before = served.for_request(Route("g", "m2"))
    promote(store, "g", "m2", "v3")
    after = served.for_request(Route("g", "m2"))
    assert (before.version, after.version, swaps(served)) == ("v1", "v3", 2)  # load + swap
    assert after.index.ids[0].startswith("v3-")
    # the request that took v1 before the swap still answers wholly from v1
    ((_, ids),) = ranked_hits(before.index, Q, 3)[0]
    assert all(i.startswith("v1-") for i in ids.tolist())
    rollback(store, "g", "m2")
    assert served.for_request(Route("g", "m2")).version == "v1" and swaps(served) == 3


def test_without_the_check_each_request_only_the_watchers_poll_follows(served, store):
    promote(store, "g", "m2", "v2")
    assert served.for_request(Route("g", "m2"), check=False).version == "v1"  # stale until the poll
    served.refresh()
    assert served.for_request(Route("g", "m2"), check=False).version == "v2"


def test_the_old_index_is_freed_when_its_last_request_lets_go(served, store):
    held = served.for_request(Route("g", "m2"))
    freed = served.metrics.freed._value.get()
    promote(store, "g", "m2", "v2")
    served.for_request(Route("g", "m2"))
    gc.collect()
    assert served.metrics.freed._value.get() == freed  # a request still holds v1's index
    del held
    gc.collect()
    assert served.metrics.freed._value.get() == freed + 1


def test_a_revoke_is_a_404_from_the_next_request_and_a_rollback_serves_again(served, store):
    served.for_request(Route("g", "m2"))
    revoke(store, "g", "m2")
    with pytest.raises(NotServedError, match="'m2' may not query gallery 'g': revoked at"):
        served.for_request(Route("g", "m2"))
    assert served.listing()["model"]["g"]["m2"]["serves"] is None
    rollback(store, "g", "m2")
    assert served.for_request(Route("g", "m2")).version == "v1"


def test_a_retired_model_is_a_404(served, store):
    retire(store, "m3", "replaced")
    with pytest.raises(NotServedError, match="model m3 was retired at .*replaced"):
        served.for_request(Route("g", "m3"))
    assert served.for_request(Route("g", "m1")).version == "v1"


def test_unknown_names_are_404s_listing_the_valid_ones(served):
    with pytest.raises(NotServedError, match="gallery 'gg' is not served: galleries are g; did"):
        served.for_request(Route("gg", "m2"))
    with pytest.raises(NotServedError, match="its models are m1, m2, m3; did you mean 'm2'"):
        served.for_request(Route("g", "m22"))


def test_a_model_granted_after_the_start_is_served_from_the_next_poll(served, store):
    from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

    Catalog(store).register_model(ModelRecord("m4", "", 4, "bct"))
    served.refresh()
    with pytest.raises(NotServedError, match="its models are m1, m2, m3"):
        served.for_request(Route("g", "m4"))
    Catalog(store).grant(QueryGrant("g", "v1", "m4", "compatible"))
    served.refresh()
    assert served.for_request(Route("g", "m4")).version == "v1"


def alias_swaps(served: Served) -> float:
    return served.metrics.alias_swaps.labels("g", "prod")._value.get()


def test_a_named_alias_is_served_and_follows_set_rollback_and_its_models_revoke(store):
    prod = Route("g", "prod", "alias")
    aliases.set_alias(store, "g", "prod", "v1", "m1")
    served = Served(store)
    served.refresh()
    first = served.for_request(prod)
    assert (first.version, first.model, alias_swaps(served)) == ("v1", "m1", 1)
    assert served.listing()["alias"]["g"]["prod"]["model"] == "m1"
    aliases.set_alias(store, "g", "prod", "v3", "m2")  # a new pair: version and model
    moved = served.for_request(prod)
    assert (moved.version, moved.model, alias_swaps(served)) == ("v3", "m2", 2)
    assert moved.index.ids[0].startswith("v3-")
    revoke(store, "g", "m2")  # the model the alias points at: the alias stops too
    with pytest.raises(NotServedError, match="model m2 was revoked on gallery g"):
        served.for_request(prod)
    assert served.for_request(Route("g", "m1")).version == "v1"  # other routes unaffected
    aliases.rollback(store, "g", "prod")  # back to (v1, m1), whose model is live
    assert (served.for_request(prod).version, alias_swaps(served)) == ("v1", 4)


def test_an_unknown_alias_is_a_404_listing_the_gallerys_aliases(store):
    aliases.set_alias(store, "g", "prod", "v1", "m1")
    served = Served(store)
    served.refresh()
    with pytest.raises(NotServedError, match="has no alias 'prd': its aliases are prod; did you"):
        served.for_request(Route("g", "prd", "alias"))
    aliases.set_alias(store, "g", "staging", "v4", "m1")  # made after the start
    served.refresh()
    assert served.for_request(Route("g", "staging", "alias")).version == "v4"


def test_ids_queries_are_read_from_a_flat_index_without_scanning_the_files(
    served, store, monkeypatch
):
    from raycompat.errors import StoreError
    from raycompat.serving import stored_rows

    scanned = stored_rows.stored_vectors(store, "g", "v1", ["v1-3", "v1-0"])
    loaded = served.for_request(Route("g", "m2"))
    assert loaded.order is not None  # the exact in-memory index holds the vectors

    def no_scan(*args, **kwargs):
        raise AssertionError("the version's files were scanned")

    monkeypatch.setattr(stored_rows, "stored_vectors", no_scan)
    np.testing.assert_array_equal(loaded.stored(store, ["v1-3", "v1-0"]), scanned)
    with pytest.raises(StoreError, match=r"g/v1 holds no row with id\(s\) \['nope'\]"):
        loaded.stored(store, ["v1-3", "nope"])


def test_a_promote_to_a_version_it_cannot_load_is_503_and_the_others_stay_ready(
    served, store, caplog
):
    corrupt(store, "v3")
    promote(store, "g", "m2", "v3")
    for _ in range(2):  # the second request does not load again: the same state, the same error
        with pytest.raises(UnloadableError, match="g/m2 serves v3, which cannot be loaded here"):
            served.for_request(Route("g", "m2"))
    assert served.for_request(Route("g", "m2"), check=False).version == "v1"  # --poll-only
    assert served.listing()["model"]["g"]["m2"]["unloadable"].startswith("g/m2 serves v3")
    assert served.counts() == {"pairs": 3, "aliases": 0, "unloadable": 1} and served.ready()
    for _ in range(5):  # five polls, one warning: the same error is logged once a minute
        served.refresh()
    warned = [r for r in caplog.records if "g/m2 serves v3" in r.getMessage()]
    assert len(warned) == 1 and "kept serving v1" in warned[0].getMessage()
    rollback(store, "g", "m2")
    assert served.for_request(Route("g", "m2")).version == "v1"
    assert (
        served.counts()["unloadable"] == 0
        and "unloadable" not in served.listing()["model"]["g"]["m2"]
    )


def test_an_index_built_after_the_load_is_swapped_in_at_the_next_poll(served, store):
    """Issue 52, item 5b: a version loaded before its index was built (adopt publishes first)
    is searched exactly until the watcher's poll finds the pointer, then from the build."""
    from raycompat.index.version_index import build_version_index

    m1 = Route("g", "m1")
    exact = served.for_request(m1)
    assert exact.source == "exact" and exact.note
    build = build_version_index(store, "g", "v1", use_gpu=False).rsplit("/", 1)[-1]
    assert served.for_request(m1) is exact  # the check before each search reads no pointer
    before = swaps(served, "m1")
    served.refresh()
    built = served.for_request(m1)
    assert (built.version, built.source, built.note) == ("v1", f"build {build}", None)
    assert swaps(served, "m1") == before + 1
    assert served.listing()["model"]["g"]["m1"]["index"] == f"build {build}"
    served.refresh()
    assert served.for_request(m1) is built  # the same pointer: nothing loaded again


def test_a_published_index_it_cannot_use_is_not_loaded_again_at_each_poll(store):
    """The pointer names a corrupt build: the load falls back to an exact search, and the
    next polls (the same pointer) keep that snapshot instead of reading the version again."""
    import glob

    from raycompat.index.version_index import build_version_index

    build_version_index(store, "g", "v1", use_gpu=False)
    (path,) = glob.glob(f"{store.root}/g/_index/v1/*/index.faiss")
    with open(path, "r+b") as out:
        out.write(b"garbage")
    served = Served(store)
    served.refresh()
    first = served.for_request(Route("g", "m1"))
    assert first.source == "exact" and "its index is unusable" in first.note
    served.refresh()
    assert served.for_request(Route("g", "m1")) is first
