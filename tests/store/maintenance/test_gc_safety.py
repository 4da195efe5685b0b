"""gc touches only what it can prove is its own, and stores are marked (issue 22, item 3)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from functools import partial

import numpy as np
import pyarrow.fs as pafs
import pytest

from raycompat.cli.app import main
from raycompat.serving.serving_map import serving_map
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.store.commit.lease import LeaseOwner
from raycompat.store.maintenance.gc import GcArgumentError, collect, make_plan, plan_gc
from raycompat.store.maintenance.marker import MARKER_FORMAT, MARKER_NAME, UnmarkedStoreError
from tests.store.maintenance.test_gc import DAY, age, expire, publish


def listing(root) -> dict[str, int]:
    """Every file under ``root`` with its size."""
    return {
        os.path.relpath(os.path.join(folder, name), root): os.path.getsize(
            os.path.join(folder, name)
        )
        for folder, _, files in os.walk(root)
        for name in files
    }


def _files_under(store, path: str) -> list:
    """The files (objects) under ``path``, by a fresh listing."""
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    found = store.filesystem.get_file_info(selector)
    return [e for e in found if e.type == pafs.FileType.File]


def stage(store, version, name, **lease):
    """A staging area holding one part, its writer gone quiet (heartbeat stopped)."""
    info = VersionInfo(version, "m1", 4, False, f"{version} = x")
    staging = store.begin("g", info, name, owner=LeaseOwner("j", "other-host", 1), **lease)
    staging.write_table(embedding_table([f"{name}-a"], np.ones((1, 4))), "p.parquet")
    staging.lease.stop()
    return staging


@pytest.fixture
def store(tmp_path):
    """A store whose retention is one day: gc's ``--older-than`` may not be shorter."""
    return GalleryStore(str(tmp_path / "store"), retention_s=DAY)


def test_an_unmarked_folder_is_refused_and_nothing_is_deleted(tmp_path, capsys):
    folder = tmp_path / "not-a-store"
    for rel in ("x/_data/v1/job/p.parquet", "x/_index/v9/b/index.faiss", "x/_data/v2/j/_tmp/t"):
        os.makedirs(folder / os.path.dirname(rel), exist_ok=True)
        (folder / rel).write_bytes(b"somebody else's data")
    age(str(folder))
    before = listing(folder)
    for extra in (["--dry-run"], []):
        assert main(["gc", "--store", str(folder), "--older-than", "1d", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{folder} is not a marked raycompat store" in err[0]
        assert f"raycompat mark-store --store {folder}" in err[0]
    with pytest.raises(UnmarkedStoreError):
        plan_gc(GalleryStore(str(folder)))
    assert listing(folder) == before


def test_collect_rechecks_the_marker(store):
    stage(store, "v1", "dead").lease.release()
    age(store.path("g"))
    expire(store.path("g", "_data", "v1", "dead"))
    items = plan_gc(store)
    assert [i.kind for i in items] == ["staging"]
    os.remove(store.path(MARKER_NAME))
    before = listing(store.root)
    with pytest.raises(UnmarkedStoreError):
        collect(store, items)
    assert listing(store.root) == before


def test_writers_mark_the_store_and_an_unknown_marker_format_is_refused(tmp_path, capsys):
    store = GalleryStore(str(tmp_path / "a"))
    publish(store, "v1")
    marker = json.loads(open(store.path(MARKER_NAME)).read())
    assert marker["format"] == MARKER_FORMAT and marker["created"]
    catalog_only = GalleryStore(str(tmp_path / "b"))
    Catalog(catalog_only).register_model(ModelRecord("m1", "", 4))
    assert os.path.isfile(catalog_only.path(MARKER_NAME))
    assert store.mark() is False  # already marked: left as it is
    with open(store.path(MARKER_NAME), "w") as handle:
        json.dump({"format": "raycompat.store/9", "created": "2030-01-01"}, handle)
    assert main(["gc", "--store", store.root]) == 1
    err = capsys.readouterr().err.strip()
    assert store.path(MARKER_NAME) in err and "'raycompat.store/9'" in err


def test_mark_store_marks_an_old_store_and_refuses_a_folder_that_is_not_one(tmp_path, capsys):
    store = GalleryStore(str(tmp_path / "old"))
    publish(store, "v1")
    os.remove(store.path(MARKER_NAME))  # written before markers existed
    assert main(["gc", "--store", store.root]) == 2
    capsys.readouterr()
    assert main(["mark-store", "--store", store.root]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"marked {store.root} as a raycompat store ({MARKER_NAME}): " + (
        "gallery g (1 version(s))"
    )
    assert main(["mark-store", "--store", store.root]) == 0
    assert "is already marked (raycompat.store/1, created " in capsys.readouterr().out
    assert json.loads(open(store.path(MARKER_NAME)).read())["retention_s"] == 7 * DAY  # default
    assert main(["gc", "--store", store.root, "--older-than", "7d", "--json"]) == 0

    other = tmp_path / "photos"
    (other / "_data").mkdir(parents=True)
    assert main(["mark-store", "--store", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{other} holds no gallery record" in err[0] and "--force" in err[0]
    assert not (other / MARKER_NAME).exists()
    assert main(["mark-store", "--store", str(other), "--force"]) == 0
    assert capsys.readouterr().out.strip().endswith(": empty")
    assert (other / MARKER_NAME).is_file()


def test_older_than_shorter_than_the_stores_retention_is_a_usage_error(store, capsys):
    publish(store, "v1")
    assert main(["gc", "--store", store.root, "--older-than", "12h", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--older-than 12 h is shorter than the store's retention 1 d" in err[0]
    # the retention is the store's marker's, whatever the process that opens it asks for
    other = GalleryStore(store.root, lease_timeout_s=600, retention_s=7 * DAY)
    assert other.retention_s == DAY
    with pytest.raises(GcArgumentError, match="--older-than 24 h is shorter than .* 1 d"):
        plan_gc(other, older_than_s=DAY - 1)
    assert plan_gc(other, older_than_s=DAY) == []
    assert main(["gc", "--store", store.root, "--older-than", "1d", "--dry-run"]) == 0


def test_a_stalled_writers_staging_is_kept_until_its_lease_expired_long_enough(store, capsys):
    stalled = stage(store, "v1", "stalled", lease_timeout_s=0.2)
    gone = stage(store, "v2", "gone", lease_timeout_s=0.2)
    time.sleep(0.3)  # both leases have just expired
    age(store.path("g"), leases=True)  # every file looks two days old
    expire(gone.path)  # only this one's heartbeat is two days old
    assert main(["gc", "--store", store.root, "--older-than", "1d"]) == 0
    printed = capsys.readouterr().out
    assert "removed 1 item(s)" in printed and "abandoned, lease not live" in printed
    assert os.path.isfile(f"{stalled.path}/_lease/00000001.json")
    assert not os.path.exists(gone.path)
    kept = make_plan(store).kept  # at the store's retention, the shortest gc may use
    assert [(k.what, k.reason.split(" ago")[1]) for k in kept] == [
        ("g/_data/v1/stalled", ", younger than --older-than 1 d")
    ]
    assert kept[0].reason.startswith("lease expired ")


def test_a_staging_area_a_version_record_names_is_kept(store):
    publish(store, "v1")
    first = store.version("g", "v1")  # v2 reuses v1's files (a copy of its record)
    later = replace(first, version="v2", lineage="v2 = copy", created="2999-01-01T00:00:00+00:00")
    store.backend.create_exclusive(store.path("g", "_versions", "v2.json"), later.to_json())
    age(store.path("g"), leases=True)
    expire(store.path("g", "_data", "v1", "job-v1"))
    served = partial(serving_map, store)  # what raycompat gc hands gc
    plan = make_plan(store, older_than_s=DAY, keep_versions=1, served=served)
    assert [(i.kind, i.reason) for i in plan.items] == [("version", "superseded (keep 1)")]
    assert ("g/_data/v1/job-v1", "named by version v2") in {  # v1's record goes
        (k.what, k.reason) for k in plan.kept
    }
    collect(store, plan.items)
    assert [v.version for v in store.versions("g")] == ["v2"]
    assert all(os.path.isfile(p) for p, _ in store.version_files("g", later))


def test_dry_run_says_what_it_keeps_and_why(store, capsys):
    publish(store, "v1")
    publish(store, "v2")
    publish(store, "v3", lineage="v3 = h(v2)")
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", "", 4))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted", {}))
    live = store.begin("g", VersionInfo("v4", "m1", 4, False, "v4 = x"), "live")
    done = stage(store, "v5", "done")
    done.lease.release()
    age(store.path("g"), leases=False)
    live.lease.heartbeat()
    args = ["gc", "--store", store.root, "--keep-versions", "1", "--dry-run"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    keeps = {line for line in lines if line.startswith("keep ")}
    assert "keep g/v1: queried by m1" in keeps
    assert "keep g/v2: on the lineage of v3" in keeps
    assert "keep g/v3: one of the newest 1" in keeps
    assert "keep g/_data/v1/job-v1: named by version v1" in keeps
    job = live.lease.record.owner.job
    assert f"keep g/_data/v4/live: lease live (job {job!r}, heartbeat 0 s ago)" in keeps
    assert "keep g/_data/v5/done: lease released 0 s ago, younger than --older-than 1 d" in keeps
    assert lines[-1] == "would remove 0 item(s), 0 bytes"
    live.release()


def test_gc_on_s3_refuses_an_unmarked_prefix_and_waits_for_the_lease(s3_bucket):
    import s3fs

    bucket, options = s3_bucket
    fs = s3fs.S3FileSystem(**options)
    fs.pipe(f"{bucket}/photos/x/_data/v1/j/p.parquet", b"not ours")
    with pytest.raises(UnmarkedStoreError, match=f"s3://{bucket}/photos is not a marked"):
        plan_gc(GalleryStore(f"s3://{bucket}/photos", options))
    assert fs.cat(f"{bucket}/photos/x/_data/v1/j/p.parquet") == b"not ours"

    # a short lease and retention: S3 dates files by the server's clock (to the second), so
    # they cannot be aged; 4 s leaves a commit 2 s (half of it) between a part and its record
    writer = GalleryStore(f"s3://{bucket}/store", options, lease_timeout_s=0.5, retention_s=4)
    publish(writer, "v1")
    dead = stage(writer, "v2", "dead")
    store = GalleryStore(writer.root, options)  # gc in another process: the marker's retention
    assert store.retention_s == 4
    with pytest.raises(GcArgumentError, match="shorter than the store's retention 4 s"):
        make_plan(store, older_than_s=3)
    plan = make_plan(store)
    assert plan.items == [] and {k.what for k in plan.kept} == {
        "g/_data/v1/job-v1",
        "g/_data/v2/dead",
    }
    time.sleep(4.8)  # its lease expired 4.3 s ago, longer than the retention, and its files too
    items = plan_gc(store)
    assert [(i.kind, i.uri) for i in items] == [("staging", f"s3://{dead.path}")]
    [item] = items
    every = {e.path for e in _files_under(store, dead.path)}
    assert set(item.files) == every and len(every) == 3  # its part, part record and lease
    collect(store, items)
    assert _files_under(store, dead.path) == []  # (S3 folder markers, "dir/" objects, stay)
    assert store.read("g", "v1").num_rows == 20
    assert fs.exists(f"{bucket}/store/{MARKER_NAME}")
