"""Randomized soak of the store under real pauses (issue 37; docs/store.md, "Invariants").

    .venv/bin/python benchmarks/store_soak.py --backend both --trials 200 --seed 1 [--write]

Why a soak: the store promises that a published version's files are never deleted, that gc
touches only the store's own galleries, and that every error is one line, whatever pause a
writer or gc takes between two lines of code. A unit test pins one interleaving; this drives
many random ones with real processes. Each trial runs 1-3 writer processes on one version
(usually one staging name, so they take over from one another; sometimes different names, so
they race), which stop themselves (SIGSTOP) at the store's steps for 0.5-5 s (past the 2 s
lease, below the 8 s retention), are SIGKILLed, or abort; gc runs all the while in its own
process, paused at random between planning and deleting. After every trial the harness checks
every file each published version lists (present, its size and sha256), the user files planted
inside the store root (byte-identical), and every error a writer or gc reported (one line, a
``RaycompatError``). It prints the counts as JSON; ``--write`` saves them to
``results/store_soak_cpu.json``. ``tests/store/test_store_soak.py`` runs a short seeded soak.

The store is reused across trials, so that areas abandoned early become collectable while later
trials run, and a trial sometimes reruns an earlier unpublished version under its staging name,
as a rerun job resumes. The harness passes ``retention_s`` only to a store that takes it and
always passes ``older_than_s`` to gc, so it runs on the store before and after issue 37.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs

from raycompat.errors import RaycompatError
from raycompat.store import GalleryStore, LeaseHeldError, VersionInfo, embedding_table
from raycompat.store.commit.lease import LeaseOwner
from raycompat.store.maintenance.gc import collect, make_plan

BENCH_DIR = Path(__file__).resolve().parent
LEASE_S = 2.0
RETENTION_S = 8.0  # far beyond every stall below, as a real retention is beyond any real pause
WRITER_STALL_S = (0.5, 5.0)
GC_STALL_S = (0.5, 6.0)
TRIAL_TIMEOUT_S = 90.0
GALLERY, ROWS, WIDTH = "g", 40, 4
ACTIONS = {"commit": 40, "abort-on-refusal": 20, "abort": 20, "bad-commit": 20}
PLANTED = {  # user files inside the store root that are no gallery's (paths under the root)
    "notes/_data/2024/drafts/draft.txt": b"a user's draft, not the store's\n",
    "photos/_index/v1/x.bin": bytes(range(256)) * 4,
    f"{GALLERY}/_data/stray.txt": b"a stray file directly under a gallery's data folder\n",
}
# Children import this module from the same tree as the harness, so both run one raycompat.
CHILD = (
    f"import sys; sys.path[:0] = [{str(BENCH_DIR.parent)!r}, {str(BENCH_DIR)!r}]; "
    "import store_soak; store_soak.child_main(sys.argv[1:])"
)


# ---- in the child processes -------------------------------------------------------------------


def open_store(root: str, options: dict) -> GalleryStore:
    """The soak's store: 2 s lease; the retention too where the store takes one (issue 37)."""
    kwargs = {"lease_timeout_s": LEASE_S}
    if "retention_s" in inspect.signature(GalleryStore.__init__).parameters:
        kwargs["retention_s"] = RETENTION_S
    return GalleryStore(root, options, **kwargs)


def stop_self() -> None:
    """SIGSTOP this process; the harness sees it stopped and SIGCONTs it after a stall."""
    os.kill(os.getpid(), signal.SIGSTOP)


class StopBeforeDelete:
    """The store's filesystem, calling ``before()`` (a SIGSTOP or SIGKILL) once just before
    its first delete: the pause after every check an abort or gc makes and before the delete
    they checked for. pyarrow filesystems take no new attributes, so this wraps one."""

    def __init__(self, fs: pafs.FileSystem, before=stop_self):
        self._fs, self._before = fs, before

    def __getattr__(self, name: str):
        return getattr(self._fs, name)

    def _pause(self) -> None:
        before, self._before = self._before, lambda: None
        before()

    def delete_dir(self, *args, **kwargs):
        self._pause()
        return self._fs.delete_dir(*args, **kwargs)

    def delete_dir_contents(self, *args, **kwargs):
        self._pause()
        return self._fs.delete_dir_contents(*args, **kwargs)

    def delete_file(self, *args, **kwargs):
        self._pause()
        return self._fs.delete_file(*args, **kwargs)


def error_record(step: str, error: BaseException) -> dict:
    return {
        "step": step,
        "type": type(error).__name__,
        "message": str(error),
        "raycompat": isinstance(error, RaycompatError),
    }


def child_main(argv: list[str]) -> None:
    """``writer ROOT OPTIONS SPEC`` or ``gc ROOT OPTIONS SEED``: what the harness starts."""
    kind, root, options = argv[0], argv[1], json.loads(argv[2])
    if kind == "writer":
        run_writer(open_store(root, options), json.loads(argv[3]))
    else:
        sys.exit(run_gc(open_store(root, options), random.Random(int(argv[3]))))


def run_writer(store: GalleryStore, spec: dict) -> None:
    """One writer: begin, write the parts, commit (or abort), with the spec's faults at its
    steps. Prints one JSON line: the files it published, or its errors."""
    steps: list = []

    def at(step: str) -> None:
        steps.append([step, round(time.time(), 3)])
        if spec["kill_at"] == step:
            os.kill(os.getpid(), signal.SIGKILL)
        if spec["stop_at"] == step:
            stop_self()

    create, record = store.backend.create_exclusive, f"/_versions/{spec['version']}.json"

    def create_exclusive(path, data):  # every commit check passed: the record is next
        if path.endswith(record):
            at("record")
        return create(path, data)

    store.backend.create_exclusive = create_exclusive
    errors: list[dict] = []
    files = publish(store, spec, at, errors)
    out = {"writer": spec["writer"], "published": files, "errors": errors, "steps": steps}
    print(json.dumps(out), flush=True)


def begin(store: GalleryStore, spec: dict, errors: list):
    """``store.begin``, retried while a live writer holds the area (for the spec's patience),
    as a scheduler reruns a job: a takeover happens once the holder stalls past its lease."""
    info = VersionInfo(spec["version"], "m", WIDTH, False, f"{spec['version']} = soak")
    owner = LeaseOwner(spec["job"], spec["host"] or socket.gethostname(), os.getpid())
    deadline = time.time() + spec["patience_s"]
    while True:
        try:
            return store.begin(GALLERY, info, spec["staging"], owner=owner)
        except LeaseHeldError as error:
            if time.time() > deadline:
                errors.append(error_record("begin", error))
                return None
            time.sleep(0.3)
        except Exception as error:
            errors.append(error_record("begin", error))
            return None


def publish(store: GalleryStore, spec: dict, at, errors: list) -> list[str] | None:
    """Write ``parts`` parts of ROWS rows and commit. ``abort``: abort instead of committing
    (as the upgrade job's verify step does after a failed check); ``bad-commit``: commit with
    a wrong row count, refused, then abort; ``abort-on-refusal``: abort after any refused
    commit; ``commit``: release after a refused one (as the pipelines do)."""
    staging = begin(store, spec, errors)
    if staging is None:
        return None
    at("begun")
    rng, step = np.random.default_rng(spec["seed"]), "write"
    try:
        for k in range(spec["parts"]):
            ids = np.arange(k * ROWS, (k + 1) * ROWS)
            table = embedding_table(ids, rng.random((ROWS, WIDTH)))
            staging.write_table(table, f"part-{k}.parquet")
            at(f"part-{k}")
        step = "commit"
        if spec["action"] != "abort":
            wrong = spec["action"] == "bad-commit"
            return staging.commit(expected_rows=ROWS * spec["parts"] + wrong).files
    except Exception as error:
        errors.append(error_record(step, error))
    try:
        if spec["action"] == "commit":
            staging.release()
            return None
        if "abort-delete" in (spec["stop_at"], spec["kill_at"]):
            pausing = StopBeforeDelete(store.backend.filesystem, lambda: at("abort-delete"))
            store.backend.filesystem = pausing
            if hasattr(staging, "filesystem"):
                staging.filesystem = pausing
        staging.abort()
    except Exception as error:
        errors.append(error_record("abort" if spec["action"] != "commit" else "release", error))
    return None


def run_gc(store: GalleryStore, rng: random.Random) -> int:
    """gc in a loop (plan, then collect; ``older_than_s`` = the retention), printing the items
    each pass handed to collect. It stops itself at random between planning and collecting,
    and inside collect just before its first delete. An error: one JSON line, then exit 1 (the
    harness restarts it), as ``raycompat gc`` run from cron would."""
    fs = store.backend.filesystem
    while True:
        try:
            plan = make_plan(store, older_than_s=RETENTION_S)
            if plan.items and rng.random() < 0.5:
                stop_self()
            if rng.random() < 0.5:
                store.backend.filesystem = StopBeforeDelete(fs)
            collect(store, plan.items)
        except Exception as error:
            print(json.dumps({"error": error_record("gc", error)}), flush=True)
            return 1
        finally:
            store.backend.filesystem = fs
        done = [[item.kind, item.uri] for item in plan.items]
        print(json.dumps({"t": round(time.time(), 3), "collected": done}), flush=True)
        time.sleep(rng.uniform(0.5, 2.0))


# ---- in the harness ---------------------------------------------------------------------------


def stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


class Child:
    """A writer or gc process with its log files. :meth:`tick` continues it (SIGCONT) a
    stall after it stopped, whether it stopped itself at a store step or the harness did."""

    def __init__(self, argv: list[str], logs: Path, name: str, stall):
        self.name, self.stall, self.resume_at, self.resumed = name, stall, None, 0.0
        self.out_path, self.err_path = logs / f"{name}.out", logs / f"{name}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            argv = [sys.executable, "-c", CHILD, *argv]
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
        self.started = time.time()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tick(self, now: float) -> None:
        if not self.alive():
            return
        if self.resume_at is None and now - self.resumed > 0.2 and stopped(self.proc.pid):
            self.resume_at = now + self.stall()
        elif self.resume_at is not None and now >= self.resume_at:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.resume_at, self.resumed = None, now

    def pause(self, now: float, seconds: float) -> None:
        if self.alive() and self.resume_at is None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.resume_at = now + seconds

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def lines(self) -> list[str]:
        return self.out_path.read_text().splitlines()

    def stderr_tail(self) -> str:
        return self.err_path.read_text()[-2000:]


@dataclass
class Tally:
    """What the soak found so far (see :func:`summary`)."""

    trials: int = 0
    writers: int = 0
    published: int = 0
    aborted: int = 0
    killed: int = 0
    refused: Counter = field(default_factory=Counter)
    lost: dict = field(default_factory=dict)  # version -> what is wrong with one of its files
    foreign: dict = field(default_factory=dict)  # planted path -> "missing" / "changed"
    bad_errors: list = field(default_factory=list)
    hashes: dict = field(default_factory=dict)  # (path, size, mtime) -> sha256 (read once)
    published_files: dict = field(default_factory=dict)  # version -> files a writer published
    check_s: float = 0.0  # time spent checking the store after the trials

    def error(self, source: str, error: dict) -> None:
        """Count one reported error; a raw one (not a RaycompatError) or one of several lines
        (a traceback) is a bad error."""
        if source == "writer":
            self.refused[error["type"]] += 1
        if not error["raycompat"] or "\n" in error["message"]:
            self.bad_errors.append({"source": source, **error})


class GcRunner:
    """gc in its own process for the whole soak. Besides its own pauses (``run_gc``), the
    harness SIGSTOPs it at random moments for 0.5-6 s, and restarts it whenever it exits,
    counting the error it printed (one line from a RaycompatError, or a bad error)."""

    def __init__(self, root: str, options: dict, logs: Path, rng: random.Random, tally: Tally):
        self.args, self.logs, self.rng, self.tally = [root, json.dumps(options)], logs, rng, tally
        self.runs: list[Child] = []
        self.next_pause = time.time() + rng.uniform(1, 4)
        self.start()

    def start(self) -> None:
        argv = ["gc", *self.args, str(self.rng.randrange(2**31))]
        stall = lambda: self.rng.uniform(*GC_STALL_S)  # noqa: E731
        self.runs.append(Child(argv, self.logs, f"gc-{len(self.runs)}", stall))

    def tick(self, now: float) -> None:
        child = self.runs[-1]
        if not child.alive():
            self.ended(child)
            self.start()
            return
        child.tick(now)
        if now >= self.next_pause:
            child.pause(now, self.rng.uniform(*GC_STALL_S))
            self.next_pause = now + self.rng.uniform(2, 8)

    def ended(self, child: Child) -> None:
        errors = [json.loads(line)["error"] for line in child.lines() if '"error"' in line]
        for error in errors:
            self.tally.error("gc", error)
        if not errors and child.proc.returncode != -signal.SIGKILL:
            why = f"gc exited {child.proc.returncode}: {child.stderr_tail()}"
            self.tally.bad_errors.append({"source": "gc", "message": why})

    def finish(self) -> dict:
        """Stop gc; what its passes collected, by kind."""
        self.runs[-1].kill()
        passes, collected = 0, Counter()
        for child in self.runs:
            for line in child.lines():
                event = json.loads(line)
                passes += "collected" in event
                collected.update(kind for kind, _ in event.get("collected", []))
        return {"passes": passes, "restarts": len(self.runs) - 1, "collected": dict(collected)}


def writer_spec(rng: random.Random, name: str, version: str, staging: str, parts: int) -> dict:
    """One writer's run and faults, drawn at random: an action, a SIGSTOP at one of its steps
    (the record's create weighted up), a SIGKILL at a step or after a time, a start offset
    and how long it retries a held staging area."""
    action = rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
    steps = ["begun", *[f"part-{k}" for k in range(parts)], "record"]
    steps += ["abort-delete"] if action != "commit" else []
    stop_at = kill_at = kill_after = None
    if rng.random() < 0.6:
        stop_at = "record" if rng.random() < 0.5 else rng.choice(steps)
    if rng.random() < 0.15:
        if rng.random() < 0.5:
            kill_at = rng.choice(steps)
        else:
            kill_after = rng.uniform(0.3, 4.0)
    return {
        "writer": name, "version": version, "staging": staging, "parts": parts,
        "action": action, "seed": rng.randrange(2**31), "job": f"job-{name}",
        "host": None if rng.random() < 0.5 else f"host-{name}",  # None: this host's pid
        "stop_at": stop_at, "stall_s": rng.uniform(*WRITER_STALL_S),
        "kill_at": kill_at, "kill_after_s": kill_after,
        "start_after_s": rng.uniform(0.0, 2.0), "patience_s": rng.uniform(1.0, 5.0),
    }  # fmt: skip


def plan_trial(rng: random.Random, trial: int, unpublished: list) -> list[dict]:
    """1-3 writers of one version: a new one, or (40%) an earlier trial's unpublished version
    under its staging name, as a rerun job resumes. Usually one staging name (takeovers),
    sometimes one per writer (publish races)."""
    if unpublished and rng.random() < 0.4:
        version, staging, parts = unpublished.pop(rng.randrange(len(unpublished)))
    else:
        version, staging, parts = f"v{trial}", f"job-{trial}", rng.choice([2, 3])
    shared = rng.random() < 0.75
    specs = []
    for k in range(rng.choice([1, 2, 2, 3, 3])):
        name = staging if shared or k == 0 else f"{staging}-{k}"
        specs.append(writer_spec(rng, f"t{trial}-w{k}", version, name, parts))
    specs[0]["start_after_s"] = 0.0
    return specs


def run_trial(root: str, options: dict, specs: list[dict], gc: GcRunner, logs: Path) -> list:
    """Start the writers at their offsets, continue the stopped ones after their stall, kill
    those due, keep gc going; returns ``(spec, child)`` once every writer has exited."""
    pending, running, start = sorted(specs, key=lambda s: s["start_after_s"]), [], time.time()
    while pending or any(child.alive() for _, child in running):
        now = time.time()
        while pending and now - start >= pending[0]["start_after_s"]:
            spec = pending.pop(0)
            argv = ["writer", root, json.dumps(options), json.dumps(spec)]
            child = Child(argv, logs, spec["writer"], lambda s=spec: s["stall_s"])
            running.append((spec, child))
        for spec, child in running:
            child.tick(now)
            due = spec["kill_after_s"] is not None and now - child.started > spec["kill_after_s"]
            if due or now - start > TRIAL_TIMEOUT_S:
                child.kill()
        gc.tick(now)
        time.sleep(0.05)
    return running


def record_outcomes(tally: Tally, running: list) -> None:
    """Count each writer's outcome; a writer that exited without its JSON line and was not
    SIGKILLed (a traceback, a hang) is a bad error."""
    for spec, child in running:
        tally.writers += 1
        lines = child.lines()
        if child.proc.returncode == -signal.SIGKILL:
            tally.killed += 1
            continue
        if child.proc.returncode != 0 or not lines:
            why = f"writer exited {child.proc.returncode}: {child.stderr_tail()}"
            tally.bad_errors.append({"source": spec["writer"], "message": why})
            continue
        out = json.loads(lines[-1])
        for error in out["errors"]:
            tally.error("writer", error)
        if out["published"] is not None:
            tally.published += 1
            tally.published_files.setdefault(spec["version"], []).append(out["published"])
        elif not out["errors"]:
            tally.aborted += 1


def read_bytes(store: GalleryStore, path: str) -> bytes | None:
    try:
        with store.filesystem.open_input_stream(path) as handle:
            return handle.read()
    except OSError:  # FileNotFoundError, or S3's error for a key deleted under the read
        return None


def file_problem(store: GalleryStore, entry: dict, listing: dict, hashes: dict) -> str | None:
    """What is wrong with one ``file_info`` entry of a version, or None. Files are never
    rewritten, so each is hashed once per (path, size, mtime); the listing of every trial
    shows one that vanished or changed since."""
    path = store.path(GALLERY, entry["path"])
    found = listing.get(path)
    if found is None:
        return f"{entry['path']} is missing"
    if found.size != entry["bytes"]:
        return f"{entry['path']} has {found.size} bytes, its record says {entry['bytes']}"
    key = (path, found.size, found.mtime_ns)
    if key not in hashes:
        data = read_bytes(store, path)
        if data is None:
            return f"{entry['path']} vanished while it was read"
        hashes[key] = hashlib.sha256(data).hexdigest()
    if hashes[key] != entry["sha256"]:
        return f"{entry['path']} does not have its recorded sha256"
    return None


def check_store(store: GalleryStore, tally: Tally, planted: dict) -> None:
    """After a trial: every file each published version lists is there with its size and
    sha256; each version a writer published is still published with the files it reported;
    the planted user files are byte-identical. Problems are added to ``tally``."""
    selector = pafs.FileSelector(store.path(GALLERY, "_data"), recursive=True)
    entries = store.filesystem.get_file_info(selector)
    listing = {e.path: e for e in entries if e.type == pafs.FileType.File}
    infos, corrupt = store.versions_report(GALLERY)
    for uri, error in corrupt:
        tally.lost.setdefault(uri, error)
    for info in infos:
        for entry in info.file_info or []:
            problem = file_problem(store, entry, listing, tally.hashes)
            if problem is not None:
                tally.lost.setdefault(info.version, problem)
                break
    listed = {info.version: info.files for info in infos}
    for version, published in tally.published_files.items():
        if any(files != listed.get(version) for files in published):
            tally.lost.setdefault(version, f"published as {published}, listed {listed}")
    for rel, data in planted.items():
        found = read_bytes(store, store.path(rel))
        if found != data:
            tally.foreign.setdefault(rel, "missing" if found is None else "changed")


def prepare_store(store: GalleryStore, planted: dict) -> None:
    """Publish ``g/v0`` the normal way (it creates the store, its marker and the gallery),
    then plant the user files inside the root."""
    info = VersionInfo("v0", "m", WIDTH, False, "v0 = soak")
    staging = store.begin(GALLERY, info, "setup")
    staging.write_table(embedding_table(np.arange(ROWS), np.ones((ROWS, WIDTH))), "p.parquet")
    staging.commit(expected_rows=ROWS)
    for rel, data in planted.items():
        path = store.path(rel)
        if store.backend.scheme == "file":
            store.filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with store.filesystem.open_output_stream(path) as handle:
            handle.write(data)


def run_soak(
    root: str, options: dict, trials: int, seed: int, logs: Path | None = None, stray: bool = True
) -> dict:
    """Soak one store (``root`` must not exist yet) for ``trials`` trials; the counts. The
    trials are drawn from ``seed`` (and which earlier versions were published, for reruns);
    gc's pauses from ``seed + 1`` and the clock.
    ``stray=False`` plants no file under ``g/_data/`` (the store before issue 37 stops every gc
    pass at it, which hides what else gc deletes)."""
    rng, tally, start = random.Random(seed), Tally(), time.time()
    planted = {k: v for k, v in PLANTED.items() if stray or not k.endswith("stray.txt")}
    store = open_store(root, options)
    prepare_store(store, planted)
    unpublished: list = []
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(logs or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        gc = GcRunner(root, options, logs, random.Random(seed + 1), tally)
        try:
            for trial in range(1, trials + 1):
                specs = plan_trial(rng, trial, unpublished)
                record_outcomes(tally, run_trial(root, options, specs, gc, logs))
                first = specs[0]
                if first["version"] not in tally.published_files:
                    unpublished.append((first["version"], first["staging"], first["parts"]))
                tally.trials += 1
                checked = time.time()
                check_store(store, tally, planted)
                tally.check_s += time.time() - checked
        finally:
            gc_counts = gc.finish()
    return summary(tally, gc_counts, store, time.time() - start)


def summary(tally: Tally, gc_counts: dict, store: GalleryStore, seconds: float) -> dict:
    """The counts: writers' outcomes (``refused``: their errors by type), ``lost`` (versions
    with a listed file missing or changed), ``foreign_deleted`` (planted user files changed
    or gone), ``bad_errors`` (raw or multi-line), gc's passes, and a few examples of each."""
    return {
        "trials": tally.trials,
        "writers": tally.writers,
        "published": tally.published,
        "aborted": tally.aborted,
        "killed": tally.killed,
        "refused": dict(sorted(tally.refused.items())),
        "lost": len(tally.lost),
        "foreign_deleted": len(tally.foreign),
        "bad_errors": len(tally.bad_errors),
        "bad_error_types": dict(Counter(e.get("type", "exit") for e in tally.bad_errors)),
        "gc": gc_counts,
        "seconds": round(seconds, 1),
        "check_seconds": round(tally.check_s, 1),
        "lease_timeout_s": LEASE_S,
        "retention_s": RETENTION_S,
        "store_retention_s": getattr(store, "retention_s", None),  # None: store before issue 37
        "examples": {
            "lost": dict(list(tally.lost.items())[:5]),
            "foreign_deleted": tally.foreign,
            "bad_errors": tally.bad_errors[:5],
        },
    }


@contextmanager
def backend_root(backend: str):
    """``(root, storage_options)`` of a fresh store: a temporary folder, or a bucket on a
    moto S3 server started here on 127.0.0.1 (as tests/conftest.py does)."""
    with tempfile.TemporaryDirectory() as tmp:
        if backend == "local":
            yield f"{tmp}/store", {}
            return
        import s3fs
        from store_io import FAKE_AWS_ENV, start_moto

        os.environ.update(FAKE_AWS_ENV)  # the children inherit them
        proc, endpoint = start_moto()
        try:
            options = {"client_kwargs": {"endpoint_url": endpoint}}
            s3fs.S3FileSystem(skip_instance_cache=True, **options).mkdir("soak")
            yield "s3://soak/store", options
        finally:
            proc.terminate()
            proc.wait()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "s3", "both"], default="both")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logs", type=Path, default=None, help="keep the children's logs here")
    parser.add_argument("--write", action="store_true", help="save results/store_soak_cpu.json")
    parser.add_argument("--no-stray", action="store_true", help="plant no file under g/_data/")
    args = parser.parse_args(argv)
    from _machine import emit, machine_info

    result = {"machine": machine_info(), "seed": args.seed, "stray": not args.no_stray, "runs": {}}
    for backend in ["local", "s3"] if args.backend == "both" else [args.backend]:
        logs = args.logs / backend if args.logs else None
        with backend_root(backend) as (root, options):
            soak = run_soak(root, options, args.trials, args.seed, logs, not args.no_stray)
            result["runs"][backend] = soak
    emit(result, BENCH_DIR / "results" / "store_soak_cpu.json" if args.write else None)
    return result


if __name__ == "__main__":
    main()
