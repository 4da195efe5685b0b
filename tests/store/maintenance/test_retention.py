"""The retention rules (issue 37; docs/store.md, "Retention"): gc deletes only unnamed files
older than the store's retention, writers adopt and commit only files younger than half of it,
and an abort deletes only its own writer's files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from raycompat.store import GalleryStore, StoreError, VersionInfo, embedding_table
from raycompat.store.commit.checks import StaleCommitError
from raycompat.store.commit.lease import LeaseOwner, read_newest
from raycompat.store.maintenance.gc import GcArgumentError, collect, make_plan
from raycompat.store.maintenance.retention import RetentionError
from tests.store.maintenance.test_gc import age as age_days
from tests.store.maintenance.test_gc import expire

RETENTION = 3600.0


def info(version="v1"):
    return VersionInfo(version, "m", 4, False, f"{version} = test")


def write(staging, part="p.parquet", start=0, rows=10):
    x = np.random.default_rng(start).random((rows, 4))
    return staging.write_table(embedding_table(np.arange(start, start + rows), x), part)


def age(path: str, seconds: float) -> None:
    """Date ``path`` (a file, or every file and folder under it, leases too) ``seconds`` back."""
    age_days(path, seconds / 86400, leases=True)


@pytest.fixture
def store(tmp_path):
    return GalleryStore(str(tmp_path / "store"), lease_timeout_s=60, retention_s=RETENTION)


def test_the_retention_is_the_stores_and_gc_may_not_go_below_it(store, tmp_path):
    store.begin("g", info(), "a").release()
    reopened = GalleryStore(store.root)  # another process, default settings
    assert reopened.retention_s == RETENTION
    with pytest.raises(GcArgumentError, match="shorter than the store's retention 1 h"):
        make_plan(reopened, older_than_s=RETENTION - 1)
    assert make_plan(reopened).items == []  # the store's retention by default
    with pytest.raises(RetentionError, match="4 lease timeouts"):
        GalleryStore(str(tmp_path / "other"), lease_timeout_s=60, retention_s=100)


def test_abort_deletes_only_its_own_files_and_a_rerun_adopts_nothing_it_withdrew(store):
    first = store.begin("g", info(), "job", owner=LeaseOwner("a", "h", 1))
    kept = write(first, "p0.parquet")
    first.release()  # a failed run: its part stays for the rerun
    second = store.begin("g", info(), "job", owner=LeaseOwner("b", "h", 2))
    assert [r.part for r in second.parts()] == ["p0.parquet"]  # adopted, not rewritten
    own = write(second, "p1.parquet", start=10)
    second.abort()  # e.g. the upgrade job's verification failed
    fs = store.filesystem
    assert fs.get_file_info(kept).type.name == "File"  # another writer's: gc's, not ours
    assert fs.get_file_info(own).type.name == "NotFound"
    third = store.begin("g", info(), "job", owner=LeaseOwner("c", "h", 3))
    assert third.parts() == []  # a corrected rerun starts afresh
    write(third, "p0.parquet", start=20)
    published = third.commit(expected_rows=10)
    assert published.files[0].split("/")[-1].startswith("g3-")


def test_commit_refuses_and_resume_skips_a_part_older_than_half_the_retention(store):
    staging = store.begin("g", info(), "job")
    path = write(staging)
    age(path, RETENTION / 2 + 60)
    with pytest.raises(StaleCommitError, match="more than half the store's retention"):
        staging.commit(expected_rows=10)
    assert store.versions("g") == []
    staging.release()
    rerun = store.begin("g", info(), "job")
    assert rerun.parts() == []  # the old part is gc's to delete: rewritten, not adopted
    write(rerun)
    assert rerun.commit(expected_rows=10).rows == 10


def test_gc_deletes_only_old_unnamed_files_and_rereads_records_and_intents(store):
    staging = store.begin("g", info(), "job")
    write(staging)
    staging.release()
    area = staging.path
    age(area, RETENTION + 60)
    expire(area, days=1)  # released a day ago
    plan = make_plan(store)
    [item] = plan.items
    assert item.kind == "staging" and len(item.files) >= 3  # part, part record, lease
    # between the plan and the delete, a commit names the part in its intent
    intent = os.path.join(area, "_intent", "g9-0000.json")
    os.makedirs(os.path.dirname(intent))
    rel = os.path.relpath(staging.files()[0], store.path("g"))
    with open(intent, "w") as handle:
        json.dump({"files": [rel]}, handle)
    collect(store, plan.items)
    assert os.path.exists(staging.files()[0])  # named by the intent: kept
    assert os.path.exists(intent)  # young: not in the plan
    assert not os.path.exists(os.path.join(area, "_lease"))


def test_gc_keeps_a_file_a_version_record_names_since_the_plan(store):
    staging = store.begin("g", info(), "job")
    write(staging)
    staging.release()
    age(staging.path, RETENTION + 60)
    expire(staging.path, days=1)
    plan = make_plan(store)
    assert plan.items
    # a writer that was paused publishes a record listing the area's part after the plan
    other = store.begin("g", info("v2"), "other")
    write(other, start=100)
    record = json.loads(other.commit().to_json())
    rel = os.path.relpath(staging.files()[0], store.path("g"))
    [part] = staging.parts()
    file_info = [{"path": rel, "bytes": part.bytes, "sha256": part.sha256}]
    record.update(version="v1", files=[rel], file_info=file_info)
    with open(store.path("g", "_versions", "v1.json"), "w") as handle:
        json.dump(record, handle)
    collect(store, plan.items)
    assert os.path.exists(staging.files()[0])


def test_gc_touches_only_the_stores_galleries_and_ignores_stray_files(store):
    staging = store.begin("g", info(), "job")
    write(staging)
    staging.commit()
    user = {
        store.path("notes", "_data", "2024", "drafts", "draft.txt"): b"my notes",
        store.path("photos", "_index", "v1", "x.bin"): b"\x00\x01",
        store.path("g", "_data", "stray.txt"): b"stray",
        store.path("g", "_data", "v9", "by-hand", "f.parquet"): b"not the store's",
    }
    for path, data in user.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
    age(store.path(), RETENTION * 10)
    plan = make_plan(store)
    collect(store, plan.items)
    for path, data in user.items():
        with open(path, "rb") as handle:
            assert handle.read() == data, path
    lines = [k.line() for k in plan.kept]
    assert "keep notes: not a gallery this store created (no _galleries/notes.json)" in lines
    assert "keep g/_data/v9/by-hand: no _lease/: not a staging area of this store" in lines
    assert store.read("g", "v1").num_rows == 10


def test_in_a_published_area_gc_takes_only_leftovers_never_a_listed_file_or_its_record(store):
    staging = store.begin("g", info(), "job")
    write(staging)
    leftover = os.path.join(staging.path, "_tmp", "p.parquet.killed")
    os.makedirs(os.path.dirname(leftover), exist_ok=True)
    with open(leftover, "wb") as handle:
        handle.write(b"half a file")
    published = staging.commit()
    age(store.path("g"), RETENTION * 10)
    [item] = make_plan(store).items
    assert (item.kind, item.files) == ("tmp", (leftover,))
    collect(store, [item])
    assert not os.path.exists(leftover)
    assert store.read("g", "v1").num_rows == 10
    part_records = os.listdir(os.path.join(staging.path, "_parts"))
    assert part_records == [published.files[0].split("/")[-1] + ".json"]


def test_mark_store_registers_the_galleries_of_a_store_written_before_gallery_records(store):
    from raycompat.cli.app import main

    staging = store.begin("g", info("v2"), "job2")
    write(staging)
    staging.commit()
    os.remove(store.path("_galleries", "g.json"))  # as an older raycompat left it
    lines = [k.line() for k in make_plan(store).kept]
    assert "keep g: not a gallery this store created (no _galleries/g.json)" in lines
    assert main(["mark-store", "--store", store.root]) == 0
    assert os.path.isfile(store.path("_galleries", "g.json"))
    lines = [k.line() for k in make_plan(store).kept]
    assert not any(line.startswith("keep g:") for line in lines)


def test_a_writer_whose_lease_outlasts_a_quarter_of_the_retention_is_refused(store):
    with pytest.raises(RetentionError, match="shorter than 4 lease timeouts"):
        store.begin("g", info(), "job", lease_timeout_s=RETENTION)
    assert not os.path.exists(store.path("g"))  # nothing written


def test_a_part_file_gone_under_its_writer_is_one_line_naming_the_version(store, monkeypatch):
    staging = store.begin("g", info(), "job")

    class TmpRemoved:  # gc or a person removed the temporary file before it was moved
        def __getattr__(self, name):
            return getattr(store.filesystem, name)

        def move(self, src, dest):
            raise FileNotFoundError(f"Failed renaming '{src}' to '{dest}'")

    monkeypatch.setattr(staging, "filesystem", TmpRemoved())
    with pytest.raises(StoreError, match="version v1: could not publish part p.parquet") as error:
        write(staging)
    assert "\n" not in str(error.value) and "rerun the job to resume" in str(error.value)
    assert store.versions("g") == []


def test_a_lease_file_removed_between_listing_and_reading_is_listed_again(store, monkeypatch):
    staging = store.begin("g", info(), "job")
    backend, real_read = store.backend, store.backend.read
    calls = []

    def read_after_gc(path):  # the first read finds the file gone, as if gc had removed it
        calls.append(path)
        if len(calls) == 1:
            raise FileNotFoundError(path)
        return real_read(path)

    monkeypatch.setattr(backend, "read", read_after_gc)
    assert read_newest(backend, staging.lease_dir).generation == 1
    assert len(calls) == 2
