"""Named aliases (``prod``): set among compatible pairs only, swap, roll back, race, and the
versions gc keeps for them (issue 40, item 2). The store is ``test_served_log.served_store``:
gallery g with v1 and v4 of m1, v2 and v3 of m2; m1's grant on v1 (extracted), m2's and m3's on
v1 (compatible: they passed the criterion against m1)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from functools import partial

import pytest

from raycompat.errors import CorruptFileError, NotInStoreError, UsageError
from raycompat.serving import aliases
from raycompat.serving.aliases import (
    IncompatiblePairError,
    NamedAliasConflictError,
    log,
    resolve,
    rollback,
    set_alias,
)
from raycompat.serving.resolve import aliased_version
from raycompat.serving.served_log import NoRollbackError, RevokedError, revoke
from raycompat.serving.serving_map import serving_map
from raycompat.store import GalleryStore
from raycompat.store.catalog.decisions import DecisionRecord, Decisions
from raycompat.store.catalog.retired import RetiredModelError, retire
from raycompat.store.commit.lease import LeaseOwner
from raycompat.store.maintenance.gc import make_plan
from tests.serving import test_served_log
from tests.serving.test_served_log import served_copy
from tests.store.maintenance.test_gc import DAY, age

served_template = test_served_log.served_template  # the session's template store, a fixture


@pytest.fixture
def store(served_template, tmp_path) -> GalleryStore:
    return GalleryStore(served_copy(served_template, tmp_path))


def points(store: GalleryStore, alias: str = "prod") -> tuple[str, str]:
    record = resolve(store, "g", alias)
    return record.gallery_version, record.model_version


def test_an_alias_swaps_among_compatible_pairs_and_rolls_back_pair_by_pair(store):
    first = set_alias(store, "g", "prod", "v1", "m1")
    assert (first.seq, first.previous, first.back, first.why) == (
        1,
        None,
        None,
        "m1's grant (extracted)",
    )
    assert first.by == dataclasses.asdict(LeaseOwner())  # who wrote it: job, host, pid
    criterion = set_alias(store, "g", "prod", "v4", "m3")  # m3 passed against m1, v4 is m1's
    assert criterion.relation == "compatible" and "criterion against m1" in criterion.why
    assert criterion.previous == {"gallery_version": "v1", "model_version": "m1"}
    assert set_alias(store, "g", "prod", "v2", "m2").why == "v2 is m2's own version"
    assert set_alias(store, "g", "prod", "v2", "m2") is None  # already: nothing written
    served = aliased_version(store, "g", "prod")  # the core's resolution, as search uses it
    assert (served.gallery_version, served.model_version, served.source) == (
        "v2", "m2", "alias prod (change 3)",
    )  # fmt: skip
    assert rollback(store, "g", "prod").pair == {"gallery_version": "v4", "model_version": "m3"}
    assert rollback(store, "g", "prod").pair == {"gallery_version": "v1", "model_version": "m1"}
    with pytest.raises(NoRollbackError, match="alias prod on gallery g has nothing to roll back"):
        rollback(store, "g", "prod")
    names = sorted(os.listdir(store.path("g", "_named", "prod")))
    assert names == [f"{n:08d}.json" for n in range(1, 6)]  # append-only, one file per change
    assert points(store) == ("v1", "m1")


@pytest.mark.parametrize(
    "version, model, why",
    [
        ("v2", "m1", "v2 holds m2's features and m1 queries v1 (extracted); no published "
         "decision says its queries are compatible with m2's features; m1 may search v1, v4 of g"),
        ("v3", "m3", "m3 passed the compatibility criterion against m1, not m2; m3 may search "
         "v1, v4"),
        ("v1", "m9", "m9's upgrade was refused against m1 on "),
    ],
)  # fmt: skip
def test_an_incompatible_pair_is_refused_naming_why_and_nothing_is_written(
    store, version, model, why
):
    refused = DecisionRecord("g", "m9", "refused", "M(m9, v1) 0.41 < M(m1, m1) 0.6", "0", "m1")
    Decisions(store).put(refused)  # m9 was judged and refused: never registered
    with pytest.raises(IncompatiblePairError) as caught:
        set_alias(store, "g", "prod", version, model)
    message = str(caught.value)
    assert message.startswith(f"alias prod may not point at ({version}, {model}) on g: ")
    assert why in message and "\n" not in message and isinstance(caught.value, UsageError)
    assert not os.path.exists(store.path("g", "_named"))


def test_unknown_names_list_those_that_exist(store):
    with pytest.raises(NotInStoreError, match="did you mean 'v2'"):
        set_alias(store, "g", "prod", "v22", "m2")
    with pytest.raises(NotInStoreError, match="'m8' is not registered"):
        set_alias(store, "g", "prod", "v1", "m8")  # never judged either: the name is unknown
    set_alias(store, "g", "prod", "v1", "m1")
    with pytest.raises(NotInStoreError, match="no alias 'prd'.*did you mean 'prod'"):
        resolve(store, "g", "prd")
    with pytest.raises(NotInStoreError, match="no alias 'staging'"):
        rollback(store, "g", "staging")


def test_a_writer_with_a_stale_view_loses_the_change_number_and_racers_never_share_one(store):
    stale = log(store, "g", "prod")
    allowed = aliases.gate(store, "g", "prod", "v2", "m2")
    set_alias(store, "g", "prod", "v1", "m1")
    with pytest.raises(NamedAliasConflictError, match="recorded change 1 of alias 'prod'"):
        aliases._append(store, stale, ("g", "prod", "set", "v2", "m2", allowed, None), None)
    assert points(store) == ("v1", "m1") and len(log(store, "g", "prod")) == 1
    barrier, outcomes = threading.Barrier(4), []

    def race(version: str, model: str) -> None:
        barrier.wait()
        try:
            outcomes.append(set_alias(store, "g", "prod", version, model) is not None)
        except NamedAliasConflictError:
            outcomes.append(False)

    pairs = [("v2", "m2"), ("v3", "m2"), ("v4", "m1"), ("v4", "m3")]
    threads = [threading.Thread(target=race, args=pair) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = log(store, "g", "prod")  # contiguous and readable
    assert 1 <= len(records) - 1 == sum(outcomes)


def test_a_revoked_or_retired_model_serves_no_alias(store):
    set_alias(store, "g", "prod", "v2", "m2")
    revoke(store, "g", "m2")
    with pytest.raises(RevokedError, match="model m2 was revoked on gallery g at .* refusing to"):
        resolve(store, "g", "prod")
    with pytest.raises(RevokedError, match="refusing to point alias staging at it"):
        set_alias(store, "g", "staging", "v3", "m2")
    retire(store, "m3")
    with pytest.raises(RetiredModelError, match="model m3 was retired at"):
        set_alias(store, "g", "prod", "v1", "m3")


def test_gc_keeps_what_aliases_point_at_and_may_roll_back_to(store):
    set_alias(store, "g", "prod", "v2", "m2")
    set_alias(store, "g", "prod", "v4", "m1")  # v2: prod's rollback target
    set_alias(store, "g", "staging", "v3", "m2")
    retire(store, "m2")  # an alias keeps its versions whatever became of its model
    assert serving_map(store, "g") == {
        "v1": {"queried by": ["m1", "m3"]},
        "v2": {"a rollback target of alias": ["prod"]},
        "v3": {"aliased as": ["staging"]},
        "v4": {"aliased as": ["prod"]},
    }
    age(store.path("g"), leases=True)
    served = partial(serving_map, store)  # what raycompat gc hands gc
    plan = make_plan(store, older_than_s=DAY, keep_versions=1, served=served)
    kept = {k.what: k.reason for k in plan.kept if k.kind == "version"}
    assert kept == {
        "g/v1": "queried by m1, m3",
        "g/v2": "a rollback target of alias prod",
        "g/v3": "aliased as staging",
        "g/v4": "aliased as prod; one of the newest 1",
    }
    assert not [i for i in plan.items if i.kind == "version"]


def test_a_corrupt_record_is_named_and_gc_refuses_to_guess(store):
    set_alias(store, "g", "prod", "v1", "m1")
    path = store.path("g", "_named", "prod", "00000001.json")
    with open(path) as handle:
        record = json.load(handle)
    os.chmod(path, 0o644)
    with open(path, "w") as handle:
        json.dump({**record, "back": "one"}, handle)
    with pytest.raises(CorruptFileError, match="00000001.json: named alias record key 'back'"):
        resolve(store, "g", "prod")
    with pytest.raises(CorruptFileError):
        make_plan(store, older_than_s=DAY, keep_versions=1, served=partial(serving_map, store))
