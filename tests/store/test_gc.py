"""`raycompat gc`: what killed jobs, rebuilt indexes and old versions leave (issue 15, item 6)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import numpy as np
import pytest

from raycompat.index.version_index import build_version_index
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.gc import collect, plan_gc
from raycompat.store.lease import LEASE_DIR, LeaseOwner, LeaseRecord
from raycompat.store.model_catalog import Catalog, ModelRecord, QueryGrant

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


@pytest.fixture
def store(tmp_path):
    return GalleryStore(str(tmp_path / "store"))


def test_abandoned_staging_tmp_and_old_index_builds_are_collected(store):
    publish(store, "v1")
    dead = store.begin("g", VersionInfo("v2", "m2", 4, False, "v2 = x"), "killed",
                       owner=LeaseOwner("j", "other-host", 1), lease_timeout_s=0.5)
    dead.write_table(embedding_table(["a"], np.ones((1, 4))), "p.parquet")
    dead.lease.stop()  # killed on another host: its heartbeat will age
    first = build_version_index(store, "g", "v1", use_gpu=False).rsplit("/", 1)[1]
    build_version_index(store, "g", "v1", use_gpu=False)  # a rebuild: `first` is superseded
    tmp = store.path("g", "_data", "v1", "job-v1", "_tmp")
    os.makedirs(tmp, exist_ok=True)
    time.sleep(0.6)  # the killed job's lease expires
    open(f"{tmp}/p.parquet.dead", "wb").write(b"partial")
    assert plan_gc(store, older_than_s=DAY) == []  # everything is recent
    age(store.path("g"))
    expire(dead.path)
    build_version_index(store, "g", "v1", use_gpu=False)  # a fresh current build
    found = kinds(plan_gc(store, older_than_s=DAY))
    assert ("staging", "_data/v2/killed") in found
    assert ("tmp", "_data/v1/job-v1/_tmp") in found
    assert ("index", f"_index/v1/{first}") in found
    assert not any(k == "version" or p.endswith("job-v1") for k, p in found)
    items = plan_gc(store, older_than_s=DAY)
    assert collect(store, items) > 0
    assert plan_gc(store, older_than_s=DAY) == []
    assert not os.path.exists(dead.path) and not os.path.exists(tmp)
    assert store.read("g", "v1").num_rows == 20  # the published version is untouched


def test_a_live_jobs_staging_is_never_collected(store):
    live = store.begin("g", VersionInfo("v1", "m1", 4, False, "v1 = x"), "running")
    live.write_table(embedding_table(["a"], np.ones((1, 4))), "p.parquet")
    age(store.path("g"))  # old files, but the lease heartbeats
    live.lease.heartbeat()
    assert plan_gc(store, older_than_s=store.lease_timeout_s) == []
    live.release()
    expire(live.path)
    found = kinds(plan_gc(store, older_than_s=store.lease_timeout_s))
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


def test_retention_keeps_newest_served_and_lineage_versions(store):
    publish(store, "v1")
    publish(store, "v2", model="m2")  # served by m2 (a grant)
    publish(store, "v3")
    publish(store, "v4", lineage="v4 = h(v3)")
    publish(store, "v5", lineage="v5 = h(v4)", model="m5")
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m2", "", 4, "bct", None, run="r"))
    catalog.grant(QueryGrant("g", "v2", "m2", "compatible", {}))
    age(store.path("g"), leases=True)  # every writer has stopped
    assert [i for i in plan_gc(store, older_than_s=DAY) if i.kind == "version"] == []
    found = kinds(plan_gc(store, older_than_s=DAY, keep_versions=1))
    # v5 newest; v4 and v3 on its lineage; v2 served by m2: only v1 goes, with its files
    assert found == {("version", "_versions/v1.json"), ("staging", "_data/v1/job-v1")}
    collect(store, plan_gc(store, older_than_s=DAY, keep_versions=1))
    assert [v.version for v in store.versions("g")] == ["v2", "v3", "v4", "v5"]
    assert store.read("g", "v2").num_rows == 20


def test_bad_arguments_are_refused(store):
    with pytest.raises(ValueError, match="keep_versions >= 1"):
        plan_gc(store, keep_versions=0)


def test_cli_gc_dry_run_lists_and_real_run_deletes(store, capsys):
    from raycompat.cli.app import duration_s, main

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
