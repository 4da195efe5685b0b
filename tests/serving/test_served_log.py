"""Aliases per query model: promote, rollback, current; revoke and retire tombstones, and the
serving map gc keeps versions by (issue 23, item 4)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from functools import partial

import pytest

from raycompat.errors import CorruptFileError, NotInStoreError, StoreError, UsageError
from raycompat.serving import served_log
from raycompat.serving.served_log import (
    AliasConflictError,
    NoRollbackError,
    NotServableError,
    RevokedError,
    changes,
    current,
    promote,
    revoke,
    rollback,
)
from raycompat.serving.serving_map import query_models, serving_map
from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.store.catalog.retired import RetiredModelError, retire
from raycompat.store.commit.lease import Lease, LeaseLostError
from raycompat.store.maintenance.gc import collect, make_plan
from tests.store.catalog.test_models import publish as publish_in
from tests.store.maintenance.test_gc import DAY, age, publish


def served_store(store: GalleryStore) -> GalleryStore:
    """Gallery g: v1 (m1), v2 and v3 (m2), v4 (m1, the newest). m1 queries v1, m2 queries v1
    (compatible) by their grants; m3 queries v1 too."""
    for version, model in (("v1", "m1"), ("v2", "m2"), ("v3", "m2"), ("v4", "m1")):
        publish(store, version, model=model)
    catalog = Catalog(store)
    for model in ("m1", "m2", "m3"):
        catalog.register_model(ModelRecord(model, "", 4, "bct"))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted"))
    catalog.grant(QueryGrant("g", "v1", "m2", "compatible", {"cross": 0.7}))
    catalog.grant(QueryGrant("g", "v1", "m3", "compatible"))
    return store


@pytest.fixture(scope="session")
def served_template(tmp_path_factory) -> str:
    """:func:`served_store` written once; each test works on a copy (``served_copy``)."""
    root = str(tmp_path_factory.mktemp("served") / "store")
    served_store(GalleryStore(root, retention_s=DAY))  # gc's --older-than may be a day
    return root


def served_copy(template: str, tmp_path) -> str:
    return shutil.copytree(template, str(tmp_path / "store"))


@pytest.fixture
def store(served_template, tmp_path) -> GalleryStore:
    return GalleryStore(served_copy(served_template, tmp_path))


def serves(store: GalleryStore, model: str = "m2") -> tuple[str, str, str]:
    found = current(store, "g", model)
    return found.gallery_version, found.relation, found.source


def test_without_aliases_a_model_serves_its_grant(store):
    assert serves(store) == ("v1", "compatible", "grant")
    with pytest.raises(StoreError, match="may not query gallery 'g': no grant"):
        current(store, "g", "m9")  # today's one-line error, unchanged


def test_promote_and_rollback_walk_the_alias_history_back_to_the_grant(store):
    first = promote(store, "g", "m2", "v2")
    assert (first.seq, first.previous, first.back) == (1, "v1", 0) and "pid" in first.writer
    assert serves(store) == ("v2", "extracted", "alias 1")
    assert promote(store, "g", "m2", "v3").previous == "v2"
    assert promote(store, "g", "m2", "v3") is None  # already served: nothing written
    assert serves(store)[0] == "v3"
    assert rollback(store, "g", "m2").gallery_version == "v2"
    assert serves(store) == ("v2", "extracted", "alias 3")
    assert rollback(store, "g", "m2").gallery_version == "v1"
    assert serves(store) == ("v1", "compatible", "alias 4")  # the grant's relation again
    with pytest.raises(NoRollbackError, match="m2 on gallery g has nothing to roll back to"):
        rollback(store, "g", "m2")
    names = sorted(os.listdir(store.path("g", "_aliases", "m2")))
    assert names == [f"{n:08d}.json" for n in range(1, 5)]  # append-only, one file per change
    assert serves(store, "m1") == ("v1", "extracted", "grant")  # other models untouched


def test_only_a_version_the_model_may_serve_is_promoted(store):
    with pytest.raises(NotServableError, match="may not serve g v4: it may serve v1, v2, v3"):
        promote(store, "g", "m2", "v4")  # m1's own version, not m2's grant
    with pytest.raises(NotServableError, match="may serve v1 "):
        promote(store, "g", "m3", "v9")
    assert isinstance(NotServableError("x"), UsageError)  # exit 2
    with pytest.raises(NotInStoreError, match="did you mean 'm2'"):
        promote(store, "g", "m22", "v2")
    assert not os.path.exists(store.path("g", "_aliases"))


def test_a_writer_with_a_stale_view_of_the_log_loses_the_change_number(store):
    stale = served_log.log(store, "g", "m2")  # read before another operator's promote landed
    promote(store, "g", "m2", "v3")
    with pytest.raises(AliasConflictError, match="recorded change 1 of 'm2' on 'g' first"):
        served_log._append(store, stale, ("g", "m2", "promote", "v2", 0), None)
    assert serves(store)[0] == "v3" and len(served_log.log(store, "g", "m2")) == 1


def test_racing_promotes_never_share_a_change_number(store):
    barrier, outcomes = threading.Barrier(4), []

    def race(version: str) -> None:
        barrier.wait()
        try:
            outcomes.append(promote(store, "g", "m2", version) is not None)
        except AliasConflictError:
            outcomes.append(False)

    threads = [threading.Thread(target=race, args=(v,)) for v in ("v2", "v3", "v2", "v3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = served_log.log(store, "g", "m2")  # contiguous and readable
    assert 1 <= len(records) == sum(outcomes) and serves(store)[0] == records[-1].gallery_version


def test_a_lease_holder_is_fenced_and_recorded(store):
    lease = Lease.acquire(store.backend, store.path("_jobs", "promoter", "_lease"), 60)
    record = promote(store, "g", "m2", "v2", lease=lease.ref)
    assert record.lease["generation"] == 1
    lease.release()
    with pytest.raises(LeaseLostError, match="refusing to promote m2 on g"):
        promote(store, "g", "m2", "v3", lease=lease.ref)
    assert serves(store)[0] == "v2"


def test_revoke_stops_a_model_and_rollback_undoes_it(store):
    promote(store, "g", "m2", "v2")
    assert revoke(store, "g", "m2").previous == "v2"
    assert revoke(store, "g", "m2") is None  # already revoked
    with pytest.raises(RevokedError, match=r"'m2' may not query gallery 'g': revoked at "):
        current(store, "g", "m2")
    assert rollback(store, "g", "m2").gallery_version == "v2"
    assert serves(store)[0] == "v2"
    with pytest.raises(StoreError, match="nothing to revoke"):
        revoke(store, "g", "m9")


def test_retire_stops_a_model_everywhere_and_refuses_new_grants_and_promotes(store):
    first = retire(store, "m2", reason="replaced by m3")
    assert retire(store, "m2").created == first.created  # a tombstone is written once
    with pytest.raises(RetiredModelError, match=r"^model m2 was retired at .*replaced by m3"):
        current(store, "g", "m2")
    with pytest.raises(RetiredModelError, match="refusing to promote it"):
        promote(store, "g", "m2", "v2")
    with pytest.raises(RetiredModelError, match="refusing to roll it back"):
        rollback(store, "g", "m2")
    catalog = Catalog(store)
    publish_in(store, "h", "v1", 4, "m2")
    with pytest.raises(RetiredModelError, match="refusing to grant it 'h'"):
        catalog.grant(QueryGrant("h", "v1", "m2", "extracted"))
    catalog.grant(QueryGrant("g", "v1", "m2", "compatible", {"cross": 0.7}))  # a rerun: no-op
    assert serves(store, "m1")[0] == "v1"


def test_gc_keeps_what_live_aliases_serve_and_reclaims_what_only_retired_models_served(store):
    promote(store, "g", "m2", "v3")  # m2 serves v3, may roll back to v1 (its grant)
    revoke(store, "g", "m1")  # m1 no longer serves v1, and v4 is the newest anyway
    assert serving_map(store, "g") == {
        "v3": {"queried by": ["m2"]},
        "v1": {"a rollback target of": ["m2"], "queried by": ["m3"]},
    }
    age(store.path("g"), leases=True)
    served = partial(serving_map, store)  # what raycompat gc hands gc
    plan = make_plan(store, older_than_s=DAY, keep_versions=1, served=served)
    kept = {k.what: k.reason for k in plan.kept if k.kind == "version"}
    assert kept == {
        "g/v1": "a rollback target of m2; queried by m3",
        "g/v3": "queried by m2",
        "g/v4": "one of the newest 1",
    }
    assert [i.path.rsplit("/", 1)[1] for i in plan.items if i.kind == "version"] == ["v2.json"]
    retire(store, "m3")
    rollback(store, "g", "m2")  # m2 serves v1 again: nothing older to roll back to
    promote(store, "g", "m2", "v2")  # m2 serves v2 (not yet collected); v1 its rollback target
    revoke(store, "g", "m2")  # ... and then nothing: v1, v2 and v3 served only by tombstones
    age(store.path("g"), leases=True)
    collect(store, make_plan(store, older_than_s=DAY, keep_versions=1, served=served).items)
    assert [v.version for v in store.versions("g")] == ["v4"]


def test_a_corrupt_alias_record_is_named_and_gc_refuses_to_guess(store):
    promote(store, "g", "m2", "v2")
    path = store.path("g", "_aliases", "m2", "00000001.json")
    with open(path) as handle:
        record = json.load(handle)
    os.chmod(path, 0o644)
    with open(path, "w") as handle:
        json.dump({**record, "action": "teleport"}, handle)
    with pytest.raises(CorruptFileError, match="00000001.json: alias record key 'action'"):
        current(store, "g", "m2")
    with pytest.raises(CorruptFileError):
        make_plan(store, older_than_s=DAY, keep_versions=1, served=partial(serving_map, store))


def test_aliases_on_s3_conflict_and_resolve_as_locally(s3_bucket):
    bucket, options = s3_bucket
    store = served_store(GalleryStore(f"s3://{bucket}/store", storage_options=options))
    stale = served_log.log(store, "g", "m2")
    promote(store, "g", "m2", "v2")
    with pytest.raises(AliasConflictError):  # If-None-Match: * on the change's object
        served_log._append(store, stale, ("g", "m2", "promote", "v3", 0), None)
    assert serves(store)[0] == "v2"
    retire(store, "m2")
    with pytest.raises(RetiredModelError, match="model m2 was retired at"):
        current(store, "g", "m2")


def test_changes_counts_the_log_without_reading_it_and_query_models_lists_every_model(store):
    """What the search service checks before each request (issue 42, item 3)."""
    assert changes(store, "g", "m2") == 0  # no log yet: the grant serves
    promote(store, "g", "m2", "v2")
    revoke(store, "g", "m2")
    assert changes(store, "g", "m2") == 2
    with open(store.path("g", "_aliases", "m2", "00000002.json"), "w") as handle:
        handle.write("not json")  # counted, not read: a corrupt record is current()'s to name
    assert changes(store, "g", "m2") == 2
    assert query_models(store, "g") == ["m1", "m2", "m3"]
    retire(store, "m3")
    assert query_models(store, "g") == ["m1", "m2", "m3"]  # retired still listed: 404 says why
