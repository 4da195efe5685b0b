"""`raycompat gc`: what killed jobs, rebuilt indexes and old versions leave (issue 15, item 6)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from raycompat.index.version_index import build_version_index
from raycompat.serving.serving_map import serving_map
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.store.commit.lease import LEASE_DIR, LeaseOwner, LeaseRecord
from raycompat.store.maintenance.gc import GcArgumentError, collect, make_plan, plan_gc

DAY = 24 * 3600


def publish(store, version, lineage=None, staging_name=None, model="m1"):
    info = VersionInfo(version, model, 4, False, lineage or f"{version} = extract({model})")
    staging = store.begin("g", info, staging_name or f"job-{version}")
    x = np.random.default_rng(len(version)).random((20, 4))
    staging.write_table(embedding_table([f"{version}-{i}" for i in range(20)], x), "p.parquet")
    return staging.commit()


def age(path: str, days: float = 2, leases: bool = False) -> None:
    """Make everything under ``path`` look ``days`` old; lease files only with ``leases`` (a
    live lease fences its heartbeat on its file's stamp, and gc dates a lease by its heartbeat:
    see :func:`expire`)."""
    then = time.time() - days * DAY
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if leases or d != LEASE_DIR]
        for name in files + dirs:
            os.utime(os.path.join(folder, name), (then, then))
    os.utime(path, (then, then))


def expire(staging_path: str, days: float = 2) -> None:
    """Make a stopped or released lease look ``days`` old: its last heartbeat and its files."""
    lease_dir = os.path.join(staging_path, LEASE_DIR)
    path = os.path.join(lease_dir, max(n for n in os.listdir(lease_dir) if n[0].isdigit()))
    with open(path, "rb") as handle:
        record = LeaseRecord.from_json(handle.read(), path)
    with open(path, "wb") as handle:
        handle.write(replace(record, heartbeat=record.heartbeat - days * DAY).to_json())
    age(lease_dir, days, leases=True)


def kinds(items) -> set[tuple[str, str]]:
    return {(i.kind, i.path.split("/g/", 1)[1]) for i in items}


def files(item) -> set[str]:
    """The files a staging or tmp item would delete, relative to the gallery."""
    return files_of(*item.files)


def files_of(*paths: str) -> set[str]:
    return {p.split("/g/", 1)[1] for p in paths}


def tree(path: str) -> set[str]:
    """Every file under ``path``, relative to the gallery."""
    return {
        os.path.join(folder, name).split("/g/", 1)[1]
        for folder, _, names in os.walk(path)
        for name in names
    }


@pytest.fixture
def store(tmp_path):
    """A store whose retention is one day: gc's ``--older-than`` may not be shorter."""
    return GalleryStore(str(tmp_path / "store"), retention_s=DAY)


def test_abandoned_staging_leftovers_and_old_index_builds_are_collected(store):
    publish(store, "v1")
    dead = store.begin(
        "g",
        VersionInfo("v2", "m2", 4, False, "v2 = x"),
        "killed",
        owner=LeaseOwner("j", "other-host", 1),
        lease_timeout_s=0.5,
    )
    dead.write_table(embedding_table(["a"], np.ones((1, 4))), "p.parquet")
    dead.lease.stop()  # killed on another host: its heartbeat will age
    first = build_version_index(store, "g", "v1", use_gpu=False).rsplit("/", 1)[1]
    second = build_version_index(store, "g", "v1", use_gpu=False).rsplit("/", 1)[1]
    area = store.path("g", "_data", "v1", "job-v1")
    published = tree(area)  # v1's part, its part record, its intent and lease
    tmp = f"{area}/_tmp"
    os.makedirs(tmp, exist_ok=True)
    time.sleep(0.6)  # the killed job's lease expires
    open(f"{tmp}/p.parquet.dead", "wb").write(b"partial")
    # a killed writer's part in v1's area that v1's record does not list, with its part record
    open(f"{area}/g9-dead.p.parquet", "wb").write(b"unlisted")
    open(f"{area}/_parts/g9-dead.p.parquet.json", "wb").write(b"{}")
    assert plan_gc(store) == []  # everything is recent (gc's default: the store's retention)
    age(store.path("g"))
    expire(dead.path)
    open(f"{tmp}/p.parquet.young", "wb").write(b"being written")  # younger than the retention
    build_version_index(store, "g", "v1", use_gpu=False)  # a fresh current build
    plan = make_plan(store)
    items = {(i.kind, i.path.split("/g/", 1)[1]): i for i in plan.items}
    assert set(items) == {
        ("staging", "_data/v2/killed"),
        ("tmp", "_data/v1/job-v1"),
        ("index", f"_index/v1/{first}"),
        ("index", f"_index/v1/{second}"),
    }
    assert files(items["staging", "_data/v2/killed"]) == tree(dead.path)  # every file of it
    # in v1's area only the leftovers: never v1's part, its part record, intent or lease
    assert files(items["tmp", "_data/v1/job-v1"]) == {
        "_data/v1/job-v1/_tmp/p.parquet.dead",
        "_data/v1/job-v1/g9-dead.p.parquet",
        "_data/v1/job-v1/_parts/g9-dead.p.parquet.json",
    }
    assert any(
        k.what == "g/_data/v1/job-v1" and "younger than --older-than 1 d" in k.reason
        for k in plan.kept
    )  # the young temporary file
    assert collect(store, plan.items) > 0
    assert plan_gc(store) == []
    assert not os.path.exists(dead.path)  # its files deleted one by one, then its empty folders
    assert tree(area) == published | {"_data/v1/job-v1/_tmp/p.parquet.young"}
    assert store.read("g", "v1").num_rows == 20  # the published version is untouched


def test_a_live_jobs_staging_is_never_collected(store):
    live = store.begin("g", VersionInfo("v1", "m1", 4, False, "v1 = x"), "running")
    live.write_table(embedding_table(["a"], np.ones((1, 4))), "p.parquet")
    age(store.path("g"))  # old files, but the lease heartbeats
    live.lease.heartbeat()
    assert plan_gc(store) == []  # even at the shortest --older-than: the store's retention
    live.release()
    expire(live.path)
    found = kinds(plan_gc(store))
    assert found == {("staging", "_data/v1/running")}


def test_dry_run_plan_deletes_nothing_and_gc_skips_a_staging_taken_since(store):
    dead = store.begin("g", VersionInfo("v1", "m1", 4, False, "v1 = x"), "job")
    dead.write_table(embedding_table(["a"], np.ones((1, 4))), "p.parquet")
    dead.release()
    age(store.path("g"))
    expire(dead.path)
    items = plan_gc(store, older_than_s=DAY)
    assert kinds(items) == {("staging", "_data/v1/job")}
    assert os.path.exists(dead.path)  # planning deleted nothing
    store.begin("g", VersionInfo("v1", "m1", 4, False, "v1 = x"), "job")  # a rerun takes it
    collect(store, items)
    assert [n for n in os.listdir(dead.path) if n.endswith(".parquet")]  # part names: unique


def test_keep_versions_keeps_newest_served_and_lineage_versions(store):
    publish(store, "v1")
    publish(store, "v2", model="m2")  # served by m2 (a grant)
    publish(store, "v3")
    publish(store, "v4", lineage="v4 = h(v3)")
    publish(store, "v5", lineage="v5 = h(v4)", model="m5")
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m2", "", 4, "bct", None, run="r"))
    catalog.grant(QueryGrant("g", "v2", "m2", "compatible", {}))
    age(store.path("g"))
    for version in ("v1", "v2", "v3", "v4", "v5"):
        expire(store.path("g", "_data", version, f"job-{version}"))  # every writer has stopped
    assert [i for i in plan_gc(store) if i.kind == "version"] == []
    served = partial(serving_map, store)  # what raycompat gc hands gc
    found = kinds(plan_gc(store, keep_versions=1, served=served))
    # v5 newest; v4 and v3 on its lineage; v2 served by m2: only v1 goes, with its files
    assert found == {("version", "_versions/v1.json"), ("staging", "_data/v1/job-v1")}
    collect(store, plan_gc(store, keep_versions=1, served=served))
    assert [v.version for v in store.versions("g")] == ["v2", "v3", "v4", "v5"]
    assert store.read("g", "v2").num_rows == 20
    assert not os.path.exists(store.path("g", "_data", "v1", "job-v1"))


def test_a_removed_versions_files_go_only_once_older_than_the_retention(store):
    publish(store, "v1")
    publish(store, "v2")
    age(store.path("g"))
    for version in ("v1", "v2"):
        expire(store.path("g", "_data", version, f"job-{version}"))
    area = store.path("g", "_data", "v1", "job-v1")
    [(part, _)] = store.version_files("g", store.version("g", "v1"))
    os.utime(part)  # one of v1's files is younger than the retention
    served = partial(serving_map, store)  # what raycompat gc hands gc
    plan = make_plan(store, keep_versions=1, served=served)
    # the area keeps a file, so its lease and part records stay with it: nothing of it goes yet
    assert kinds(plan.items) == {("version", "_versions/v1.json")}
    assert "keep g/_data/v1/job-v1: 1 file(s) younger than --older-than 1 d" in " ".join(
        k.line() for k in plan.kept
    )
    collect(store, plan.items)
    assert [v.version for v in store.versions("g")] == ["v2"]  # the record went at once ...
    assert os.path.isfile(part)  # ... its young file stays
    age(part)  # a day later, it is old too
    assert kinds(plan_gc(store, keep_versions=1, served=served)) == {("staging", "_data/v1/job-v1")}
    collect(store, plan_gc(store, keep_versions=1, served=served))
    assert not os.path.exists(area)
    assert store.read("g", "v2").num_rows == 20


def test_bad_arguments_are_refused(store):
    store.mark()  # gc first proves the folder is a store
    with pytest.raises(GcArgumentError, match="keep_versions >= 1"):
        plan_gc(store, keep_versions=0)
    with pytest.raises(GcArgumentError, match="keep_versions needs served"):
        plan_gc(store, keep_versions=1)  # the store cannot tell on its own what is served
    with pytest.raises(GcArgumentError, match="--older-than 24 h is shorter than the store's "):
        plan_gc(store, older_than_s=DAY - 1)  # not even a second shorter than the retention
    assert plan_gc(store, older_than_s=DAY) == plan_gc(store) == []


def test_cli_gc_dry_run_lists_and_real_run_deletes(store, capsys):
    from raycompat.cli.app import main
    from raycompat.cli.arguments import duration_s

    publish(store, "v1")
    dead = store.begin("g", VersionInfo("v2", "m2", 4, False, "v2 = x"), "killed")
    dead.write_table(embedding_table(["a"], np.ones((1, 4))), "p.parquet")
    dead.release()
    age(store.path("g"))
    expire(dead.path)
    assert main(["gc", "--store", store.root, "--older-than", "1d", "--dry-run", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(i["kind"], i["reason"]) for i in listed["items"]] == [
        ("staging", "abandoned, lease not live")
    ]
    assert listed["bytes"] > 0 and listed["bytes_freed"] == 0 and os.path.exists(dead.path)
    assert main(["gc", "--store", store.root, "--older-than", "3d", "--json"]) == 0  # too young
    assert json.loads(capsys.readouterr().out)["items"] == [] and os.path.exists(dead.path)
    assert main(["gc", "--store", store.root]) == 0  # the table a person reads
    printed = capsys.readouterr().out
    assert "staging" in printed and "abandoned, lease not live" in printed
    assert "removed 1 item(s)" in printed
    assert not os.path.exists(dead.path) and store.read("g", "v1").num_rows == 20
    assert (duration_s("90m"), duration_s("2d"), duration_s("30")) == (5400, 172800, 30)
    assert main(["gc", "--store", store.root + "-typo"]) == 2  # a missing store is an error
