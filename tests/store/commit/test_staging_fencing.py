"""Writer isolation and fencing under real stalls (issue 22, items 1-2; docs/store.md,
"Invariants"). A writer process stops itself (SIGSTOP) at a chosen point; the test lets its
lease expire, has another writer or gc act, then continues it (SIGCONT) and checks what was
published: only ever one writer's own verified files, never a mix, never a smaller version.
Each scenario runs on local disk and on the moto S3 server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import numpy as np
import pytest

from raycompat.store import (
    GalleryStore,
    PublishConflictError,
    VerificationError,
    VersionInfo,
    embedding_table,
)
from raycompat.store.commit.lease import LeaseLostError, LeaseOwner, read_newest
from raycompat.store.maintenance.gc import collect, plan_gc

TIMEOUT = 2.0  # lease timeout of every writer here (slack for a busy CI); stalls outlive it
RETENTION = 8.0  # the shortest retention allowed (4 lease timeouts): for the gc scenario
ROWS = 100  # per part; two parts per writer

STALLER = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    from raycompat.store import GalleryStore, VersionInfo, embedding_table
    from raycompat.store.commit.lease import LeaseOwner

    root, options, mode, rows = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    store = GalleryStore(root, options, lease_timeout_s=2.0, retention_s=float(sys.argv[5]))
    info = VersionInfo("v1", "m", 4, False, "v1 = test")
    staging = store.begin("g", info, "same-name", owner=LeaseOwner("writer-A", "host-a", 1))
    x = np.random.default_rng(1).random((2 * rows, 4))
    for k in range(2):
        ids = np.arange(k * rows, (k + 1) * rows)
        staging.write_table(embedding_table(ids, x[k * rows:(k + 1) * rows]), f"part-{k}.parquet")
    backend, create = store.backend, store.backend.create_exclusive

    def stall_at_commit(path, data):  # every check passed; stop just before the record
        if path.endswith("_versions/v1.json"):
            print("at-commit", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return create(path, data)

    if mode == "at-commit":
        backend.create_exclusive = stall_at_commit
    else:
        print("written", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        published = staging.commit(expected_rows=2 * rows)
        print(json.dumps({"result": "published", "files": published.files}))
    except Exception as error:
        print(json.dumps({"result": type(error).__name__, "error": str(error)}))
    """
)


def start(where, mode: str, retention_s: float = 3600.0) -> subprocess.Popen:
    """Writer A: two parts (ids 0..199, values of seed 1), then it stops itself at ``mode``."""
    root, options = where
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            STALLER,
            root,
            json.dumps(options),
            mode,
            str(ROWS),
            str(retention_s),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().strip()
    assert line in ("at-commit", "written"), proc.communicate()[1][-3000:]
    deadline = time.time() + 30
    while _state(proc.pid) != "T":  # stopped
        assert time.time() < deadline
        time.sleep(0.02)
    return proc


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def resume(proc: subprocess.Popen) -> dict:
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def store_of(where) -> GalleryStore:
    return GalleryStore(where[0], where[1], lease_timeout_s=TIMEOUT)


def info() -> VersionInfo:
    return VersionInfo("v1", "m", 4, False, "v1 = test")


@pytest.mark.slow
def test_a_stalled_committer_publishes_only_its_own_files(where):
    """Finding 1: A passes every check of commit and stalls before the record; B takes the area
    over and writes part-0 again; A wakes and publishes. The version is A's rows, all of them."""
    writer_a = start(where, "at-commit")
    time.sleep(1.5 * TIMEOUT)
    store = store_of(where)
    b = store.begin("g", info(), "same-name", owner=LeaseOwner("writer-B", "host-b", 2))
    assert read_newest(store.backend, b.lease_dir).generation == 2
    assert [(r.part, r.generation) for r in b.parts()] == [
        ("part-0.parquet", 1),
        ("part-1.parquet", 1),  # A's parts adopted, not rewritten
    ]
    b_rows = np.random.default_rng(2).random((ROWS, 4))
    b.write_table(embedding_table(np.arange(ROWS), b_rows), "part-0.parquet")
    assert resume(writer_a)["result"] == "published"
    table = store.read("g", "v1")
    order = np.argsort(table.column("id").to_numpy())
    stored = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[order]
    expected = np.random.default_rng(1).random((2 * ROWS, 4)).astype(np.float32)
    np.testing.assert_array_equal(stored, expected)  # A's values for every id, none of B's
    record = store.version("g", "v1")
    assert all(f.rsplit("/", 1)[1].startswith("g1-") for f in record.files)
    with pytest.raises(PublishConflictError):
        b.commit()


@pytest.mark.slow
def test_gc_of_a_stalled_writers_area_fails_the_writer_and_spares_the_next(where):
    """Finding 2: A stalls past its lease; gc removes its staging area; C starts afresh with
    the same staging name. A wakes: its heartbeat never re-creates or overwrites the lease,
    its commit fails naming C, and C publishes its own rows, all of them."""
    writer_a = start(where, "written", RETENTION)  # A creates the store: its retention
    time.sleep(TIMEOUT + RETENTION + 1.5)  # expired, and its files old, beyond the retention
    store = store_of(where)
    items = plan_gc(store)
    assert [i.kind for i in items] == ["staging"], items
    collect(store, items)
    c = store.begin("g", info(), "same-name", owner=LeaseOwner("writer-C", "host-c", 3))
    assert c.parts() == []  # nothing of A's is left to adopt
    c_rows = np.random.default_rng(3).random((2 * ROWS, 4))
    c.write_table(embedding_table(np.arange(2 * ROWS), c_rows), "part-0.parquet")
    token = read_newest(store.backend, c.lease_dir).token
    result = resume(writer_a)
    assert result["result"] == "LeaseLostError", result
    assert "writer-C" in result["error"] and "refusing to publish version v1" in result["error"]
    assert read_newest(store.backend, c.lease_dir).token == token  # A wrote no lease record
    assert c.commit(expected_rows=2 * ROWS).rows == 2 * ROWS
    assert store.read("g", "v1").num_rows == 2 * ROWS


def test_a_heartbeat_never_re_creates_a_removed_lease(where):
    store = store_of(where)
    staging = store.begin("g", info(), "job", lease_timeout_s=60)
    staging.lease.stop()  # drive the heartbeat by hand
    staging.lease._stop.clear()
    store.filesystem.delete_dir(staging.lease_dir)
    with pytest.raises(LeaseLostError, match="lease records are gone"):
        staging.lease.heartbeat()
    assert read_newest(store.backend, staging.lease_dir) is None
    with pytest.raises(LeaseLostError, match="refusing to write part p"):
        staging.write_table(embedding_table([1], np.ones((1, 4))), "p.parquet")


def test_a_stalled_heartbeat_does_not_revive_its_expired_lease(tmp_path):
    store = GalleryStore(str(tmp_path), lease_timeout_s=60)
    staging = store.begin("g", info(), "job")
    staging.lease.stop()
    staging.lease._stop.clear()
    lease = staging.lease
    lease.record = replace(lease.record, heartbeat=time.time() - 61)  # as after a 61 s stall
    on_disk = read_newest(store.backend, lease.lease_dir).heartbeat
    with pytest.raises(LeaseLostError, match="past the 60 s timeout") as lost:
        lease.heartbeat()
    assert "now: no other writer has taken it yet" in str(lost.value)  # not "replaced"
    assert read_newest(store.backend, lease.lease_dir).heartbeat == on_disk  # not rewritten
    with pytest.raises(LeaseLostError, match="is lost"):
        staging.commit()


def test_commit_refuses_a_version_with_a_missing_part(tmp_path):
    store = GalleryStore(str(tmp_path))
    staging = store.begin("g", info(), "job")
    for k in range(2):
        ids = np.arange(k * 10, k * 10 + 10)
        staging.write_table(embedding_table(ids, np.ones((10, 4))), f"part-{k}.parquet")
    os.remove(staging.files()[1])
    with pytest.raises(VerificationError, match=r"part part-1\.parquet .* is missing"):
        staging.commit()
    assert store.versions("g") == []


def test_metadata_files_are_written_once(tmp_path):
    staging = GalleryStore(str(tmp_path)).begin("g", info(), "job")
    staging.write_meta("_plan.json", b"{}")
    staging.write_meta("_plan.json", b"{}")  # the same bytes again: a no-op
    with pytest.raises(Exception, match=r"_plan\.json already exists with other content"):
        staging.write_meta("_plan.json", b'{"other": 1}')
