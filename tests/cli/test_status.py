"""``raycompat status``: live leases, running upgrades and staging areas with their progress,
read from the store and never written (issue 40). No Ray: leases are taken in this process."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import numpy as np
import pytest

from raycompat.cli.app import main
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.commit.lease import Lease, LeaseOwner, iso_utc
from raycompat.upgrade.lock import lease_dir
from tests.cli.test_startup import cli_modules

SUBMITTED = LeaseOwner(job="walk-up-1", host="node-3", pid=77, user="ana")
LONG = 600.0  # heartbeats every 150 s: none rewrites a lease file while a test reads the store


def table(ids: list[str]):
    return embedding_table(ids, np.random.default_rng(0).random((len(ids), 4)))


def plan(parts: int, rows: int) -> bytes:
    """A pipeline's ``_plan.json`` (``cluster/pipelines/resume.py``) of ``parts`` chunks."""
    chunks = [
        {"part": f"part-{k:05d}-0000.parquet", "input": k, "path": "", "start": 0, "stop": rows}
        for k in range(parts)
    ]
    return json.dumps({"identity": {"kind": "transform"}, "chunks": chunks}).encode()


@pytest.fixture
def busy(tmp_path):
    """faces: v1 published; v2 being written (1 of 3 planned parts) by a live job that also
    holds the gallery's upgrade lease; v3's writer hung (stale lease, no plan). cats: idle."""
    store = GalleryStore(str(tmp_path / "store"))
    for gallery in ("faces", "cats"):
        done = store.begin(gallery, VersionInfo("v1", "m1", 4, False, "v1 = extract(m1)"), "a")
        done.write_table(table(["a", "b"]), "part-0.parquet")
        done.commit(expected_rows=2)
    job = Lease.acquire(store.backend, lease_dir(store, "faces"), LONG, SUBMITTED)
    v2 = VersionInfo("v2", "m2", 4, False, "v2 = h(v1)")
    running = store.begin("faces", v2, "upgrade-m2", lease_timeout_s=LONG, owner=SUBMITTED)
    running.write_meta("_plan.json", plan(parts=3, rows=2))
    running.write_table(table(["a", "b"]), "part-00000-0000.parquet")
    v3 = VersionInfo("v3", "m3", 4, False, "v3 = h(v1)")
    hung = store.begin("faces", v3, "crashed", lease_timeout_s=0.2, owner=LeaseOwner("j", "h", 1))
    hung.lease.stop()  # no more heartbeats, never released
    time.sleep(0.3)
    yield store, running, job
    running.release()
    job.release()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["status", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_shows_live_leases_running_upgrades_and_their_progress(busy, capsys):
    store, running, job = busy
    code, out, _ = run(capsys, "--store", store.root, "--json")
    status = json.loads(out)
    assert code == 0 and "corrupt" not in status
    [upgrade] = status["jobs"]  # cats was never upgraded: no row
    assert (upgrade["job"], upgrade["state"], upgrade["generation"]) == (
        "upgrade faces",
        "running",
        1,
    )
    assert upgrade["by"] == asdict(SUBMITTED) and upgrade["holder"] == SUBMITTED.describe()
    assert upgrade["expires"] == iso_utc(job.record.heartbeat + LONG)
    got = [
        (s["version"], s["staging"], s["state"], s["operation"], s["parts_done"],
         s["parts_planned"], s["rows_done"], s["rows_planned"])
        for s in status["staging"]
    ]  # fmt: skip
    assert got == [  # v1 is published: not listed
        ("v2", "upgrade-m2", "running", "transform", 1, 3, 2, 6),
        ("v3", "crashed", "stale", None, 0, None, None, None),
    ]
    assert status["staging"][0]["uri"] == running.uri


def test_table_says_who_holds_what_and_how_far_it_got(busy, capsys):
    store, running, _ = busy
    code, out, _ = run(capsys, "faces", "--store", store.root)
    assert code == 0
    assert out.startswith(f"store {store.uri()}: 2 running\n")
    assert "job 'walk-up-1' on host 'node-3' (pid 77) as user 'ana'" in out
    assert "1/3 parts, 2/6 rows" in out and "stale" in out
    running.release()
    code, out, _ = run(capsys, "faces", "--store", store.root, "--json")
    assert [s["state"] for s in json.loads(out)["staging"]] == ["stopped", "stale"]


def test_a_gallery_filter_and_an_unknown_gallery(busy, capsys):
    store, _, _ = busy
    code, out, _ = run(capsys, "cats", "--store", store.root, "--json")
    assert code == 0 and (json.loads(out)["jobs"], json.loads(out)["staging"]) == ([], [])
    code, out, err = run(capsys, "face", "--store", store.root)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "no gallery 'face'" in err and "did you mean 'faces'?" in err


def _listing(root: str) -> dict[str, tuple[int, int]]:
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            stat = os.stat(os.path.join(folder, name))
            found[os.path.relpath(os.path.join(folder, name), root)] = (
                stat.st_size,
                stat.st_mtime_ns,
            )
    return found


def test_status_never_writes_and_loads_neither_torch_nor_ray(busy, capsys):
    store, _, _ = busy
    before = _listing(store.root)
    for argv in ([], ["faces"], ["--json"], ["nope"]):
        run(capsys, *argv, "--store", store.root)
    assert _listing(store.root) == before
    out = cli_modules(["status", "--store", store.root], heavy=("torch", "ray"))
    assert out["codes"] == [0] and out["loaded"] == {}, out["loaded"]
