"""Exclusive staging leases: one live writer per staging prefix, on local disk and S3.

A lease is a sequence of *generation* files under ``<staging>/_lease/``::

    _lease/00000001.json   {"generation": 1, "token": ..., "owner": {job, host, pid, user},
                            "heartbeat": <UTC time>, "timeout_s": 120, "released": false}

The owner (:class:`LeaseOwner`) is the Ray submission id of the job (``ray job submit
--submission-id``), its host, pid and OS user; every record that names a writer (versions,
decisions, alias changes) keeps the same dict as its ``by``.

- **Acquire**: create generation 1 with create-if-absent (``Backend.create_exclusive``: an
  ``O_EXCL``-style hard link locally, a PutObject with ``If-None-Match: *`` on S3). Of two
  writers that race, exactly one creates it; the other gets :class:`LeaseHeldError` at once,
  naming the holder and its last heartbeat.
- **Heartbeat**: the holder rewrites *its own* generation file every ``timeout_s / 4`` seconds
  from a daemon thread. Nobody else ever writes that file. A heartbeat never re-creates or
  revives a lease: it writes only over the file it wrote last (``Backend.replace_if``: an
  ``If-Match`` PUT on S3, a stat comparison locally), and only while its previous beat is
  younger than the timeout. A heartbeat that finds its file gone (gc removed the staging area)
  or replaced, or that wakes from a stall past the timeout, marks the writer *lost*: every later
  check, part write and commit then fails with :class:`LeaseLostError` naming who holds the
  staging area now.
- **Take over**: a lease whose heartbeat is older than its ``timeout_s``, that was released, or
  whose holder is a dead process on this host, is taken by creating generation ``n + 1`` with
  create-if-absent. Two writers racing for a takeover contend on that one name, so again
  exactly one wins. The newest generation is the lease; older files stay (they are tiny).
- **Check**: before a part file is moved into place and before the version record is created,
  the writer checks that the newest generation is still its own, unreleased, and fresh.
  Workers on other nodes check through a :class:`LeaseRef` (picklable, no heartbeat thread).

What this does not do: storage cannot refuse a write by a lease generation, so a writer that
passes its check and then stalls past ``timeout_s`` before its next write can still make that
one write. Part files and records are named uniquely per writer and never overwritten
(``staging.py``), so such a write adds a file nobody else reads; and a stale commit can at worst
publish a version made wholly of its own verified parts (docs/store.md, "What a stalled writer
can do"). Heartbeats compare wall clocks of different hosts: they are assumed to agree (NTP) to
well within ``timeout_s``.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from raycompat.errors import StoreError
from raycompat.io.filesystems import Backend, ChangedError
from raycompat.store.paths import join

logger = logging.getLogger(__name__)
LEASE_DIR = "_lease"
LEASE_FORMAT = "raycompat.lease/1"
DEFAULT_TIMEOUT_S = 120.0
UNKNOWN = "unknown"  # a field a record written before it existed does not give
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor (cli/job_exit)
RAY_SUBMISSION_ID_KEY = "job_submission_id"  # Ray's JOB_ID_METADATA_KEY
RAYCOMPAT_JOB_ENV = "RAYCOMPAT_JOB"


class LeaseHeldError(StoreError):
    """Another live writer holds the staging area's lease."""


class LeaseLostError(StoreError):
    """This writer's lease expired or was taken over; it must not publish anything more."""


def _now() -> float:
    return time.time()


def iso_utc(t: float) -> str:
    """A POSIX time as ISO-8601 UTC, to the second (how lease records and messages give it)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _ray_submission_id(environ: Mapping[str, str]) -> str | None:
    """The submission id of the Ray job this process is the entrypoint of, or None.

    Ray's job supervisor gives the entrypoint of a submitted job (``ray job submit
    --submission-id=walk-up-1``) its JobConfig as JSON in ``RAY_JOB_CONFIG_JSON_ENV_VAR``, whose
    ``metadata.job_submission_id`` is the id (``ray/dashboard/modules/job/job_supervisor.py``,
    ``_get_driver_env_vars``; Ray's own ``dashboard/modules/job/utils.py`` reads it back so).
    Ray sets no ``RAY_JOB_SUBMISSION_ID``."""
    raw = environ.get(RAY_JOB_CONFIG_ENV)
    if not raw:
        return None
    try:
        submission = json.loads(raw).get("metadata", {}).get(RAY_SUBMISSION_ID_KEY)
    except (ValueError, AttributeError):
        return None
    return submission if isinstance(submission, str) and submission else None


def job_id(environ: Mapping[str, str] | None = None) -> str:
    """Who this process runs for: the Ray submission id when Ray's job supervisor started it,
    else ``RAYCOMPAT_JOB``, else ``pid-<pid>``."""
    environ = os.environ if environ is None else environ
    return _ray_submission_id(environ) or environ.get(RAYCOMPAT_JOB_ENV) or f"pid-{os.getpid()}"


def os_user() -> str:
    """The OS user this process runs as (``uid-<n>`` where the uid has no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no USER/LOGNAME and no passwd entry (a bare container)
        return f"uid-{os.getuid()}"


@dataclass
class LeaseOwner:
    """Who holds a lease or wrote a record: the Ray job (its submission id, see :func:`job_id`),
    host, pid and OS user, named in every error. ``asdict(LeaseOwner())`` is what records keep
    as their ``by``; :meth:`from_dict` reads one back (a record older than a field: unknown)."""

    job: str = field(default_factory=job_id)
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    user: str = field(default_factory=os_user)

    @classmethod
    def from_dict(cls, raw: dict) -> LeaseOwner:
        """An owner as a record keeps it; ``user`` (added later) missing is ``"unknown"``.

        Raises:
            TypeError: an unknown key, or a missing job, host or pid.
        """
        return cls(**{"user": UNKNOWN, **raw})

    def short(self) -> str:
        """``walk-up-1 (ana@vm)``: the job, and the user and host, for a table cell."""
        return f"{self.job} ({self.user}@{self.host})"

    def describe(self) -> str:
        user = "" if self.user == UNKNOWN else f" as user {self.user!r}"
        return f"job {self.job!r} on host {self.host!r} (pid {self.pid}){user}"

    def is_dead_here(self) -> bool:
        """True only when the holder is provably gone: same host, and no such process."""
        if self.host != socket.gethostname() or self.pid == os.getpid():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False


@dataclass
class LeaseRecord:
    generation: int
    token: str
    owner: LeaseOwner
    heartbeat: float
    timeout_s: float
    released: bool = False
    aborted: bool = False  # released by abort(): no later writer adopts this or older parts
    released_at: float | None = None  # when release() marked it (None: unreleased, or older)

    def to_json(self) -> bytes:
        raw = {"format": LEASE_FORMAT, **asdict(self), "heartbeat_utc": iso_utc(self.heartbeat)}
        return json.dumps(raw, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, source: str) -> LeaseRecord:
        try:
            raw = json.loads(data)
            if raw.pop("format") != LEASE_FORMAT:
                raise ValueError(f"not a {LEASE_FORMAT} record")
            raw.pop("heartbeat_utc", None)
            raw["owner"] = LeaseOwner.from_dict(raw["owner"])
            record = cls(**raw)
            float(record.heartbeat), float(record.timeout_s), int(record.generation)
        except (ValueError, KeyError, TypeError) as error:
            raise StoreError(
                f"{source}: unreadable lease record ({error}); if no job is writing this "
                f"staging area, abort it or delete the file"
            ) from None
        return record

    def age_s(self) -> float:
        return _now() - self.heartbeat

    def expired(self) -> bool:
        return self.released or self.age_s() > self.timeout_s or self.owner.is_dead_here()

    def describe(self) -> str:
        return (
            f"{self.owner.describe()}, generation {self.generation}, last heartbeat "
            f"{iso_utc(self.heartbeat)} ({self.age_s():.0f} s ago, timeout {self.timeout_s:g} s)"
        )


def _log_takeover(uri: str, previous: LeaseRecord) -> None:
    """Say how the lease came free: a released one is the normal end of the previous run (the
    time it released, or its last heartbeat in a record older than ``released_at``); a stale
    one was taken from a writer that stopped beating or died, which an operator should know."""
    if previous.released:
        ended = previous.released_at if previous.released_at is not None else previous.heartbeat
        how = "was aborted" if previous.aborted else "finished"
        logger.info(
            "%s: the previous run (job %r on host %r) %s at %s; this run takes the lease "
            "(generation %d)",
            uri,
            previous.owner.job,
            previous.owner.host,
            how,
            iso_utc(ended),
            previous.generation + 1,
        )
    else:
        logger.warning("%s: took over the lease from %s", uri, previous.describe())


def _gen_path(lease_dir: str, generation: int) -> str:
    return join(lease_dir, f"{generation:08d}.json")


def newest(backend: Backend, lease_dir: str) -> tuple[int, str] | None:
    """``(generation, path)`` of the newest lease file under ``lease_dir``, or None."""
    selector = pafs.FileSelector(lease_dir, allow_not_found=True)
    gens = []
    for entry in backend.filesystem.get_file_info(selector):
        stem = entry.base_name.removesuffix(".json")
        if entry.type == pafs.FileType.File and stem.isdigit():
            gens.append((int(stem), entry.path))
    return max(gens) if gens else None


def read_newest(backend: Backend, lease_dir: str) -> LeaseRecord | None:
    """The newest generation's record, or None when there is none. A file removed between the
    listing and the read (gc reclaiming the area) is listed again, so the answer is what is
    there now."""
    for _ in range(3):
        found = newest(backend, lease_dir)
        if found is None:
            return None
        try:
            return LeaseRecord.from_json(backend.read(found[1]), backend.uri(found[1]))
        except FileNotFoundError:
            continue
    raise StoreError(
        f"{backend.uri(lease_dir)}: the lease records kept vanishing while being read (is gc "
        f"or someone removing this staging area?); rerun once it is quiet"
    )


def aborted_through(backend: Backend, lease_dir: str) -> int:
    """The newest generation that ended in ``abort()`` (0 if none): parts written by it or an
    older generation are withdrawn, and no later writer adopts them. O(generations) reads."""
    selector = pafs.FileSelector(lease_dir, allow_not_found=True)
    newest_aborted = 0
    for entry in backend.filesystem.get_file_info(selector):
        stem = entry.base_name.removesuffix(".json")
        if entry.type != pafs.FileType.File or not stem.isdigit() or int(stem) <= newest_aborted:
            continue
        try:
            record = LeaseRecord.from_json(backend.read(entry.path), backend.uri(entry.path))
        except FileNotFoundError:
            continue
        if record.aborted:
            newest_aborted = record.generation
    return newest_aborted


@dataclass(frozen=True)
class LeaseRef:
    """What a worker on any node needs to check a lease: where, which generation, its token."""

    lease_dir: str
    generation: int
    token: str

    def stamp(self) -> dict:
        """What a record written under this lease carries: ``{"generation", "token"}``."""
        return {"generation": self.generation, "token": self.token}

    def check(self, backend: Backend, what: str) -> None:
        """Raise :class:`LeaseLostError` unless this generation is the newest, live one.

        Args:
            what: the action about to happen (named in the error), e.g. ``"publish part-3"``.
        """
        record = read_newest(backend, self.lease_dir)
        uri = backend.uri(self.lease_dir)
        if record is None or record.generation != self.generation or record.token != self.token:
            raise LeaseLostError(
                f"{uri}: lease generation {self.generation} is lost: {self.successor(record)}; "
                f"refusing to {what}"
            )
        if record.released or record.age_s() > record.timeout_s:
            raise LeaseLostError(
                f"{uri}: lease generation {self.generation} has "
                f"{'been released' if record.released else 'expired'} ({record.describe()}); "
                f"refusing to {what}"
            )

    def successor(self, record: LeaseRecord | None) -> str:
        """Who holds the staging area instead of this generation, in words."""
        if record is None:
            return "the staging area's lease records are gone (removed by gc or by hand)"
        if (record.generation, record.token) == (self.generation, self.token):
            return f"no other writer has taken it yet ({record.describe()})"
        if record.generation == self.generation:
            return f"its lease record was replaced by another writer's ({record.describe()})"
        return f"taken over by {record.describe()}"


class Lease:
    """A held lease: heartbeats from a daemon thread until :meth:`stop` or :meth:`release`."""

    def __init__(
        self, backend: Backend, lease_dir: str, record: LeaseRecord, stamp: Any = None
    ) -> None:
        self._backend, self.lease_dir, self.record = backend, lease_dir, record
        self.ref = LeaseRef(lease_dir, record.generation, record.token)
        self._stamp = stamp  # what ``replace_if`` compares: this writer's last write of the file
        self._lost: str | None = None  # why this writer lost the lease, once it has
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def acquire(
        cls,
        backend: Backend,
        lease_dir: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        owner: LeaseOwner | None = None,
    ) -> Lease:
        """Take the lease of ``lease_dir`` (create it, or take over a dead one); start beating.

        Raises:
            LeaseHeldError: a live writer holds it (the message names it and its heartbeat).
        """
        if not timeout_s > 0:
            raise StoreError(f"lease timeout_s must be > 0, got {timeout_s!r}")
        uri = backend.uri(lease_dir)
        current = read_newest(backend, lease_dir)
        if current is not None and not current.expired():
            raise LeaseHeldError(
                f"{uri}: this staging area is being written by {current.describe()}. Wait for "
                f"that job, use another staging name, or rerun once its heartbeat is older "
                f"than the timeout"
            )
        generation = current.generation + 1 if current else 1
        record = LeaseRecord(generation, uuid.uuid4().hex, owner or LeaseOwner(), _now(), timeout_s)
        try:
            stamp = backend.create_exclusive(_gen_path(lease_dir, generation), record.to_json())
        except FileExistsError:
            winner = read_newest(backend, lease_dir)
            raise LeaseHeldError(
                f"{uri}: this staging area is being written by "
                f"{winner.describe() if winner else 'another writer'}, which took the lease "
                f"first. Wait for that job or use another staging name"
            ) from None
        if current is not None:
            _log_takeover(uri, current)
        lease = cls(backend, lease_dir, record, stamp)
        lease._start()
        return lease

    def _start(self) -> None:
        self._thread = threading.Thread(
            target=self._beat_loop, name=f"lease-heartbeat-{self.record.generation}", daemon=True
        )
        self._thread.start()

    def _beat_loop(self) -> None:
        period = self.record.timeout_s / 4
        while not self._stop.wait(period):
            try:
                self.heartbeat()
            except LeaseLostError as error:
                logger.warning("%s", error)
                return
            except Exception as error:  # storage hiccup: check() refuses once it is stale
                logger.warning("%s: lease heartbeat failed: %s", self.lease_dir, error)

    @property
    def lost(self) -> str | None:
        """Why this writer lost its lease (None while it holds it)."""
        return self._lost

    def heartbeat(self) -> None:
        """Refresh this generation's heartbeat (only its holder ever writes the file).

        Never re-creates or revives the lease: raises :class:`LeaseLostError` (and marks the
        writer lost) when the previous beat is older than the timeout (this process was
        stalled) or when the file is no longer the one this writer last wrote.
        """
        with self._lock:
            if self._stop.is_set():
                return
            if self._lost is None and self.record.age_s() > self.record.timeout_s:
                self._lose(
                    f"its last heartbeat was {self.record.age_s():.0f} s ago, past the "
                    f"{self.record.timeout_s:g} s timeout (this writer was stalled), so another "
                    f"writer or gc may have taken its staging area"
                )
            if self._lost is None:
                beat = replace(self.record, heartbeat=_now())
                path = _gen_path(self.lease_dir, beat.generation)
                try:
                    self._stamp = self._backend.replace_if(path, beat.to_json(), self._stamp)
                    self.record = beat
                except ChangedError:
                    newest_record = read_newest(self._backend, self.lease_dir)
                    self._lose(self.ref.successor(newest_record))
            if self._lost is not None:
                self._stop.set()
                raise self._lost_error("heartbeat")

    def _lose(self, why: str) -> None:
        self._lost = why

    def _lost_error(self, what: str) -> LeaseLostError:
        try:
            now = self.ref.successor(read_newest(self._backend, self.lease_dir))
        except Exception as error:  # the message must not fail on a storage hiccup
            now = f"its current holder is unknown ({error})"
        return LeaseLostError(
            f"{self._backend.uri(self.lease_dir)}: lease generation {self.record.generation} "
            f"is lost: {self._lost}; now: {now}; refusing to {what}"
        )

    def check(self, what: str) -> None:
        """Raise :class:`LeaseLostError` unless the lease is still ours and fresh."""
        if self._lost is not None:
            raise self._lost_error(what)
        self.ref.check(self._backend, what)

    def stop(self) -> None:
        """Stop heartbeating and leave the file as it is (used once the version is published:
        nothing inside a published version is written again)."""
        with self._lock:
            self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def withdraw(self, what: str) -> bool:
        """Release the lease marked *aborted* (no later writer adopts a part of this generation
        or an older one), then say whether this generation is still the newest: only then may
        the writer delete its own files, since a writer that takes over from here on reads the
        mark first. Raises :class:`LeaseLostError` if the lease was lost before."""
        self.check(what)
        self.release(aborted=True)
        if self._lost is not None:
            return False
        record = read_newest(self._backend, self.lease_dir)
        return record is not None and (record.generation, record.token) == (
            self.ref.generation,
            self.ref.token,
        )

    def release(self, aborted: bool = False) -> None:
        """Stop heartbeating and mark the lease released (and ``aborted``), so a rerun can take
        it at once. A lost lease is left alone (its file is no longer this writer's to write)."""
        self.stop()
        if self._lost is not None:
            return
        released = replace(self.record, released=True, aborted=aborted, released_at=_now())
        try:
            path = _gen_path(self.lease_dir, released.generation)
            self._stamp = self._backend.replace_if(path, released.to_json(), self._stamp)
            self.record = released
        except ChangedError:
            self._lose("its lease file changed hands before it was released")
            logger.warning("%s: lease not released: its file changed hands", self.lease_dir)
        except Exception as error:  # the lease then simply expires after timeout_s
            self._lose(f"its release failed ({error})")
            logger.warning("%s: could not release the lease: %s", self.lease_dir, error)
