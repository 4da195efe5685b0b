"""Exclusive staging leases and part records: one writer per staging area, published files
never written again (issue 18). Real processes race on local disk and on the moto S3 server."""

from __future__ import annotations

import getpass
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from raycompat.store import (
    GalleryStore,
    PublishConflictError,
    Staging,
    VerificationError,
    VersionInfo,
    embedding_table,
)
from raycompat.store.commit.lease import (
    LeaseHeldError,
    LeaseLostError,
    LeaseOwner,
    iso_utc,
    job_id,
    read_newest,
)
from raycompat.store.commit.part_record import IdFingerprint

WRITER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from raycompat.store import GalleryStore, PublishConflictError, VersionInfo, embedding_table
    from raycompat.store.commit.lease import LeaseHeldError

    root, options, who, start_at, hold = sys.argv[1:6]
    store = GalleryStore(root, json.loads(options))
    info = VersionInfo("v1", f"model-{who}", 4, False, "v1 = test")
    time.sleep(max(0.0, float(start_at) - time.time()))
    try:
        staging = store.begin("g", info, "same-name", lease_timeout_s=30)
    except (LeaseHeldError, PublishConflictError) as error:
        print(json.dumps({"who": who, "result": type(error).__name__, "error": str(error)}))
        sys.exit(0)
    print(json.dumps({"who": who, "result": "began"}), flush=True)
    rng = np.random.default_rng(len(who))
    for k in range(3):
        ids = [f"{who}-{k}-{i}" for i in range(50)]
        staging.write_table(embedding_table(ids, rng.random((50, 4))), f"part-{k}.parquet")
        time.sleep(float(hold) / 3)
    staging.commit(expected_rows=150)
    print(json.dumps({"who": who, "result": "published"}))
    """
)


def info(model: str = "m") -> VersionInfo:
    return VersionInfo("v1", model, 4, False, "v1 = test")


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 4))


def spawn(root: str, options: dict, who: str, start_at: float, hold: float = 0.6):
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, root, json.dumps(options), who, str(start_at), str(hold)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def file_states(store: GalleryStore) -> dict:
    """Bytes and mtime of every published file of ``g/v1``."""
    out = {}
    for rel in store.version("g", "v1").files:
        path = store.path("g", rel)
        with store.filesystem.open_input_stream(path) as handle:
            out[rel] = (handle.read(), store.filesystem.get_file_info(path).mtime)
    return out


@pytest.mark.slow
def test_two_processes_with_the_same_staging_name_publish_one_intact_version(where):
    """Issue 18, finding 1: both begin at the same instant; one holds the lease and publishes,
    the other is refused at once, naming the holder; a late writer cannot touch the version."""
    root, options = where
    start_at = time.time() + 3.0  # both interpreters are up by then
    procs = [spawn(root, options, who, start_at) for who in ("A", "B")]
    results = sorted((finish(p) for p in procs), key=lambda r: r["result"])
    assert [r["result"] for r in results] == ["LeaseHeldError", "published"], results
    loser, winner = results
    assert "is being written by job" in loser["error"] and "last heartbeat" in loser["error"]
    store = GalleryStore(root, options)
    published = store.version("g", "v1")
    assert published.model_version == f"model-{winner['who']}"
    table = store.read("g", "v1")  # readable: one writer's metadata throughout
    assert {i.split("-")[0] for i in table.column("id").to_pylist()} == {winner["who"]}
    assert table.num_rows == 150 and IdFingerprint.from_dict(published.ids).count == 150
    before = file_states(store)
    late = finish(spawn(root, options, "C", time.time()))  # after publish: refused
    assert late["result"] == "PublishConflictError"
    assert file_states(store) == before  # bytes and mtimes unchanged


@pytest.mark.slow
def test_killed_writer_lease_is_taken_over_and_its_parts_resumed(tmp_path):
    root = str(tmp_path / "store")
    proc = spawn(root, {}, "A", time.time(), hold=600)  # writes part-0, then sleeps
    assert json.loads(proc.stdout.readline())["result"] == "began"
    store = GalleryStore(root)
    deadline = time.time() + 60
    area = Path(store.path("g", "_data", "v1", "same-name"))
    while not list(area.glob("*.part-0.parquet")):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    with pytest.raises(LeaseHeldError, match=r"same-name/_lease: .*job 'pid-\d+'.*pid"):
        store.begin("g", info("model-A"), "same-name")  # alive: refused at once
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # same host and the pid is gone: taken over without waiting for the 30 s timeout
    staging = store.begin("g", info("model-A"), "same-name")
    assert read_newest(store.backend, staging.lease_dir).generation == 2
    assert [(r.part, r.rows, r.generation) for r in staging.parts()] == [
        ("part-0.parquet", 50, 1)  # A's part, adopted by its record, not rewritten
    ]
    for k in (1, 2):
        staging.write_table(
            embedding_table([f"A-{k}-{i}" for i in range(50)], rows(50)), f"part-{k}.parquet"
        )
    assert staging.commit(expected_rows=150).rows == 150


def test_second_begin_is_refused_and_release_lets_a_rerun_in(tmp_path):
    store = GalleryStore(str(tmp_path))
    first = store.begin("g", info(), "job", owner=LeaseOwner("nightly-42", "node-7", 1234))
    with pytest.raises(LeaseHeldError) as caught:
        store.begin("g", info(), "job")
    assert "job 'nightly-42' on host 'node-7' (pid 1234)" in str(caught.value)
    assert "last heartbeat" in str(caught.value)
    store.begin("g", info(), "other-name").release()  # other staging names are independent
    first.release()
    second = store.begin("g", info(), "job")
    assert read_newest(store.backend, second.lease_dir).generation == 2


def test_heartbeats_keep_a_lease_alive_past_its_timeout(tmp_path):
    store = GalleryStore(str(tmp_path))
    staging = store.begin("g", info(), "job", lease_timeout_s=1.0, owner=LeaseOwner("j", "h", 1))
    first_beat = read_newest(store.backend, staging.lease_dir).heartbeat
    time.sleep(2.5)  # 2.5 timeouts: only the heartbeats (every 0.25 s) keep it
    assert read_newest(store.backend, staging.lease_dir).heartbeat > first_beat
    with pytest.raises(LeaseHeldError):
        store.begin("g", info(), "job")
    staging.write_table(embedding_table(["a"], rows(1)), "p.parquet")
    assert staging.commit().rows == 1


def test_a_lease_read_while_its_holder_beats_is_whole(where):
    """A lease file is rewritten in place by each heartbeat. Every read of it, however it
    interleaves with the rewrites, sees one beat whole: on S3 a size-then-range read returns a
    torn record about half the time (CI failure of 2026-11-24), a single GET never does."""
    store = GalleryStore(*where)
    staging = store.begin("g", info(), "job", owner=LeaseOwner("j", "h", 1))
    lease = staging.lease
    beats, stop = [0], threading.Event()

    def beat() -> None:  # as fast as storage allows; records differ in length beat to beat
        while not stop.is_set():
            lease.record = replace(lease.record, timeout_s=120 + 0.5 ** (beats[0] % 9))
            lease.heartbeat()
            beats[0] += 1

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        deadline = time.time() + 20
        reads = 0
        while (reads < 100 or beats[0] < 50) and time.time() < deadline:
            assert read_newest(store.backend, staging.lease_dir).token == lease.record.token
            reads += 1
    finally:
        stop.set()
        thread.join()
    assert beats[0] >= 30 and reads >= 100  # the reads overlapped many rewrites
    staging.release()


def test_a_writer_whose_lease_was_taken_over_writes_nothing(tmp_path):
    store = GalleryStore(str(tmp_path))
    stale = store.begin("g", info(), "job", lease_timeout_s=0.2, owner=LeaseOwner("j", "h", 1))
    stale.write_table(embedding_table(["a"], rows(1)), "p0.parquet")
    stale.lease.stop()  # the holder hangs: no more heartbeats
    time.sleep(0.3)
    fresh = store.begin("g", info(), "job")
    with pytest.raises(LeaseLostError, match="taken over .* refusing to write part p1"):
        stale.write_table(embedding_table(["b"], rows(1)), "p1.parquet")
    with pytest.raises(LeaseLostError, match="refusing to publish version v1"):
        stale.commit()
    with pytest.raises(LeaseLostError, match="refusing to abort"):
        stale.abort()
    assert [r.part for r in fresh.parts()] == ["p0.parquet"]
    assert os.listdir(f"{fresh.path}/_tmp") == []  # the loser's temporary file is gone
    assert fresh.commit().rows == 1


def test_a_worker_cannot_publish_a_part_into_a_published_version(tmp_path):
    """Issue 18, finding 2: a straggling worker of the publishing job, holding its lease."""
    store = GalleryStore(str(tmp_path))
    staging = store.begin("g", info(), "job")
    staging.write_table(embedding_table(["a", "b"], rows(2)), "p0.parquet")
    worker = Staging(store.backend, store.path("g"), info(), "job", staging.lease_ref)
    staging.commit()
    before = file_states(store)
    with pytest.raises(PublishConflictError, match="refusing to write part p0"):
        worker.write_table(embedding_table(["x", "y"], rows(2, seed=1)), "p0.parquet")
    with pytest.raises(PublishConflictError, match="refusing to publish part p1"):
        worker.publish_part(worker.tmp_path("p1.parquet"), "p1.parquet", None, 0, None)
    assert file_states(store) == before


def test_a_part_replaced_behind_its_record_is_refused(tmp_path):
    store = GalleryStore(str(tmp_path))
    staging = store.begin("g", info(), "job")
    path = staging.write_table(embedding_table(["a", "b"], rows(2)), "p0.parquet")
    other = store.begin("g", info(), "elsewhere")
    donor = other.write_table(embedding_table(["a", "c"], rows(2)), "p0.parquet")
    os.replace(donor, path)  # same size and rows, other ids
    with pytest.raises(VerificationError, match=r"p0\.parquet: ids .* differ from its part record"):
        staging.commit()
    path = staging.write_table(embedding_table(["c"], rows(1)), "p0.parquet")  # a new file of it
    with open(path, "ab") as handle:
        handle.write(b"x")
    with pytest.raises(VerificationError, match=r"p0\.parquet: \d+ bytes but its part record says"):
        staging.commit()
    assert store.versions("g") == []


def test_id_fingerprint_is_an_order_independent_multiset_hash():
    import pyarrow as pa

    a = IdFingerprint.of(pa.array([3, 1, 2], pa.int64()))
    assert a == IdFingerprint.of(pa.array([1, 2, 3], pa.int64()))
    assert a != IdFingerprint.of(pa.array([1, 2, 4], pa.int64()))
    assert a != IdFingerprint.of(pa.array([1, 2, 3, 3], pa.int64()))
    parts = IdFingerprint.of(pa.array(["x", "y"])).combine(IdFingerprint.of(pa.array(["z"])))
    assert parts == IdFingerprint.of(pa.array(["z", "x", "y"]))
    assert IdFingerprint.from_dict(parts.to_dict()) == parts
    assert IdFingerprint.of(pa.array(["1"])) != IdFingerprint.of(pa.array([1], pa.int64()))


@pytest.mark.slow
@pytest.mark.ray
def test_the_same_transform_job_twice_at_once_publishes_once_and_never_rewrites(
    tmp_path, ray_local
):
    """Issue 18, finding 2: two identical `jobs/transform.py` runs (the default staging name
    `transform-v1` for both). One publishes; the other fails at `begin`, and no file of the
    published version is written again (bytes and mtimes as at the moment it was published)."""
    from tests.cluster.pipelines.test_pipelines import D_NEW, D_SIDE_NEW, make_source, random_models

    store = make_source(tmp_path / "store", "g", rows=8_000, files=4, group_rows=1_000)
    h_dir, g_dir = random_models(tmp_path)
    config = tmp_path / "job.yaml"
    config.write_text("mode: transform\nrun:\n  rows_per_file: 1000\n  actors: 2\n")
    job = Path(__file__).parents[3] / "jobs" / "transform.py"
    command = [
        sys.executable,
        str(job),
        "--config",
        str(config),
        f"ray_address={ray_local.get_runtime_context().gcs_address}",
        f"store.root={store.root}",
        "store.gallery=g",
        "source_version=v1",
        f"transformation={h_dir}",
        f"side_info_transformation={g_dir}",
        "target.version=v2",
        "target.model_version=m2",
        f"target.width={D_NEW}",
        f"target.side_info_width={D_SIDE_NEW}",
    ]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    record, published = Path(store.path("g", "_versions", "v2.json")), None
    deadline = time.time() + 300
    while any(p.poll() is None for p in procs):
        assert time.time() < deadline, "the jobs did not finish in 300 s"
        if published is None and record.exists():
            published = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in v2_files(store)}
        time.sleep(0.05)
    outputs = [p.communicate()[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes)[0] == 0 and sorted(codes)[1] != 0, outputs
    winner, loser = (outputs[codes.index(0)], outputs[1 - codes.index(0)])
    assert "version=v2 rows=8000" in winner  # the job's summary line
    # The loser stops with one line (a store error, exit 1) that says who holds the staging area
    # or that the version was published first.
    last = loser.strip().splitlines()[-1]
    assert last.startswith("transform.py: error: "), loser[-2000:]
    assert (
        "this staging area is being written by" in last
        or "already has version" in last
        or "published by another writer first" in last
        or "already exists" in last
    ), last
    assert sorted(codes)[1] == 1
    if published is None:  # published in the last 50 ms of the winner's run
        published = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in v2_files(store)}
    assert len(published) == 8
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in v2_files(store)} == published
    assert store.read("g", "v2").num_rows == 8_000


def v2_files(store: GalleryStore) -> list[Path]:
    return [Path(store.path("g", rel)) for rel in store.version("g", "v2").files]


def test_a_rerun_after_a_released_lease_says_the_previous_run_finished(tmp_path, caplog):
    """A released lease is the previous run's normal end, not a takeover (issue 40)."""
    store = GalleryStore(str(tmp_path))
    first = store.begin("g", info(), "job", owner=LeaseOwner("walk-up-1", "vm", 1, "ana"))
    first.release()
    released = read_newest(store.backend, first.lease_dir)
    assert released.released and released.released_at >= released.heartbeat
    caplog.set_level(logging.INFO, logger="raycompat.store.commit.lease")
    store.begin("g", info(), "job").release()
    finished = iso_utc(released.released_at)
    assert f"the previous run (job 'walk-up-1' on host 'vm') finished at {finished}" in caplog.text
    assert "took over" not in caplog.text


def test_a_rerun_after_a_stale_lease_says_it_took_the_lease_over(tmp_path, caplog):
    store = GalleryStore(str(tmp_path))
    stale = store.begin("g", info(), "job", lease_timeout_s=0.2, owner=LeaseOwner("j", "h", 1))
    stale.lease.stop()  # the holder hangs: no more heartbeats, never released
    time.sleep(0.3)
    caplog.set_level(logging.INFO, logger="raycompat.store.commit.lease")
    store.begin("g", info(), "job").release()
    assert "took over the lease from job 'j' on host 'h' (pid 1)" in caplog.text
    assert "s ago, timeout 0.2 s" in caplog.text and "previous run" not in caplog.text


RAY_ENTRYPOINT_ENV = json.dumps(  # what Ray's job supervisor gives a submitted entrypoint
    {"runtime_env": {}, "metadata": {"job_submission_id": "walk-up-1", "job_name": "walk-up-1"}}
)


@pytest.mark.parametrize(
    "env, job",
    [
        ({"RAY_JOB_CONFIG_JSON_ENV_VAR": RAY_ENTRYPOINT_ENV, "RAYCOMPAT_JOB": "mine"}, "walk-up-1"),
        ({"RAYCOMPAT_JOB": "mine"}, "mine"),
        ({"RAY_JOB_CONFIG_JSON_ENV_VAR": "{not json", "RAYCOMPAT_JOB": "mine"}, "mine"),
        ({"RAY_JOB_CONFIG_JSON_ENV_VAR": '{"metadata": {}}'}, f"pid-{os.getpid()}"),
        ({}, f"pid-{os.getpid()}"),
    ],
)
def test_the_owner_is_the_ray_submission_id_else_raycompat_job_else_the_pid(env, job):
    assert job_id(env) == job


def test_the_owner_reads_the_env_var_and_key_ray_sets_for_a_submitted_entrypoint(monkeypatch):
    """The names are Ray's own (job_supervisor.py sets the env var with this metadata key)."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
    from ray.dashboard.modules.job.common import JOB_ID_METADATA_KEY

    from raycompat.cli.job_exit import JOB_CONFIG_ENV
    from raycompat.store.commit import lease

    assert lease.RAY_JOB_CONFIG_ENV == RAY_JOB_CONFIG_JSON_ENV_VAR == JOB_CONFIG_ENV
    assert lease.RAY_SUBMISSION_ID_KEY == JOB_ID_METADATA_KEY
    monkeypatch.setenv(RAY_JOB_CONFIG_JSON_ENV_VAR, RAY_ENTRYPOINT_ENV)
    owner = LeaseOwner()
    assert (owner.job, owner.user) == ("walk-up-1", getpass.getuser())


def test_an_older_lease_record_without_a_user_reads_as_unknown(tmp_path):
    store = GalleryStore(str(tmp_path))
    staging = store.begin("g", info(), "job", owner=LeaseOwner("j", "h", 1, "ana"))
    staging.release()
    path = Path(staging.lease_dir) / "00000001.json"
    raw = json.loads(path.read_text())
    assert asdict(LeaseOwner.from_dict(raw["owner"])) == raw["owner"]  # what records keep
    del raw["owner"]["user"], raw["released_at"]
    path.write_text(json.dumps(raw))
    owner = read_newest(store.backend, staging.lease_dir).owner
    assert owner.user == "unknown" and owner.describe() == "job 'j' on host 'h' (pid 1)"
