"""Garbage collection of a store: what killed jobs, rebuilt indexes and old versions leave.

    served = functools.partial(serving_map, store)   # raycompat.serving.serving_map
    plan = make_plan(store, older_than_s=24 * 3600, keep_versions=3, served=served)
    for item in plan.items: print(item.kind, item.uri, item.reason)
    for keep in plan.kept: print(keep.line())     # what it keeps, and why
    collect(store, plan.items)       # deletes; ``raycompat gc`` without ``--dry-run``

gc deletes only what it can prove is its own: the root must carry the store marker
(``marker.py``; :class:`~raycompat.store.maintenance.marker.UnmarkedStoreError` otherwise), and
``older_than_s`` may not be shorter than the store's lease timeout (:class:`GcArgumentError`).
What is collected, per gallery, each only when everything under it is older than
``older_than_s`` (by modification time):

- ``staging``: a staging area ``_data/<version>/<name>/`` that no version record names a file
  under, and whose lease expired longer than ``older_than_s`` ago: released, or its last
  heartbeat plus its timeout, measured from that moment (so a writer merely stalled past its
  lease is not collected under it). An area with no lease record at all goes by its files'
  age alone.
- ``tmp``: temporary part files under ``_tmp/`` of published versions' folders, left by writers
  killed before the commit (hidden: no reader sees them, and no writer will move them: a rerun
  that resumes the area writes fresh temporary files beside them; an unpublished area's go with
  the area).
- ``index``: index builds ``_index/<version>/<build>/`` that the version's pointer does not name,
  and every index of a version that no longer exists.
- ``version``: with ``keep_versions=K``, published versions older than the newest K, unless a
  live model serves them or may roll back to them or the newest version's lineage names them
  (followed transitively). What is served is the caller's to say (``served``: the serving
  layer's ``raycompat.serving.serving_map.serving_map``, read per gallery while planning:
  served-version logs and grants, less models revoked on the gallery or retired, and the named
  aliases), so the store never imports the control plane above it; without it
  ``keep_versions`` is refused. A version only a revoked or retired model served may go. Its
  record is deleted first, so it is unpublished in one step, then its files and index.

Never collected: a published version's record or part files (except as a whole ``version``
item), part records, the model catalog, alias logs and tombstones, a staging area whose lease
is live (checked again just before deleting), and the files of an adopted version (they are
outside the store; removing such a version deletes its record only). Every kept candidate is
listed in :attr:`GcPlan.kept` with its reason.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from raycompat.errors import StoreError, UsageError
from raycompat.io.filesystems import Backend
from raycompat.store.commit.lease import LEASE_DIR, LeaseRecord, read_newest
from raycompat.store.commit.part_record import INTENT_DIR, PARTS_DIR
from raycompat.store.gallery import GalleryStore
from raycompat.store.maintenance.marker import (
    GALLERIES_DIR,
    MARKER_NAME,
    registered_galleries,
    require_marker,
)
from raycompat.store.manifest import DATA_DIR, INDEX_DIR, VERSIONS_DIR, VersionInfo
from raycompat.store.paths import SAFE_NAME, join

logger = logging.getLogger(__name__)
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]*")


class GcArgumentError(UsageError, StoreError):
    """``older_than_s`` shorter than the store's lease timeout, or ``keep_versions`` < 1: a usage
    error (``raycompat gc`` exits 2)."""


@dataclass(frozen=True)
class GcItem:
    """One thing to delete: ``kind`` (staging, tmp, index, version), its path and why."""

    kind: str
    gallery: str
    path: str
    uri: str
    reason: str
    bytes: int
    files: tuple[str, ...] = ()  # staging and tmp: the files to delete (never the folder)


@dataclass(frozen=True)
class GcKeep:
    """A candidate gc keeps: ``what`` (``"g/_data/v2/job-x"``, ``"g/v1"``) and why."""

    kind: str
    gallery: str
    what: str
    reason: str

    def line(self) -> str:
        return f"keep {self.what}: {self.reason}"


@dataclass
class GcPlan:
    items: list[GcItem] = field(default_factory=list)
    kept: list[GcKeep] = field(default_factory=list)


def span(seconds: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"3.5 h"``, ``"2 d"``: a duration for a person."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{max(seconds, 0):.0f} s"


def _children(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    return fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))


def _tree(fs: pafs.FileSystem, path: str) -> tuple[float, int, int] | None:
    """``(newest mtime in seconds, total bytes, files)`` of ``path`` (a file, or the files
    under a folder; an empty folder counts with its own mtime), or None if nothing is there."""
    top = fs.get_file_info(path)
    if top.type == pafs.FileType.NotFound:
        return None
    if top.type == pafs.FileType.File:
        return _mtime(top), top.size or 0, 1
    newest = top.mtime.timestamp() if top.mtime else 0.0  # S3 folders have no date
    size = files = 0
    for entry in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if entry.type == pafs.FileType.File:
            size, files = size + (entry.size or 0), files + 1
            newest = max(newest, _mtime(entry))
    return newest, size, files


def expired_at(backend: Backend, lease_dir: str, record: LeaseRecord) -> float | None:
    """When ``record`` stopped protecting its staging area (unix time), or None while it is
    live: its release (the newest write under ``lease_dir``, no earlier than the last
    heartbeat), else its last heartbeat plus its timeout once that has passed. A holder that
    is merely stalled still counts as live until then."""
    if record.released:
        written = _tree(backend.filesystem, lease_dir)
        return max(record.heartbeat, written[0] if written else 0.0)
    end = record.heartbeat + record.timeout_s
    return end if end < time.time() else None


def _lease_live(store: GalleryStore, staging_path: str) -> bool:
    lease_dir = join(staging_path, LEASE_DIR)
    try:
        record = read_newest(store.backend, lease_dir)
    except (StoreError, OSError):
        return True  # unreadable: not provably dead
    return record is not None and expired_at(store.backend, lease_dir, record) is None


def _by_area(named: dict[str, str]) -> dict[str, set[str]]:
    """``{"_data/<version>/<name>": the versions whose records list a file under it}``, from
    :func:`_named_files`: one pass, so each staging area is looked up, not searched for."""
    areas: dict[str, set[str]] = {}
    for rel, version in named.items():
        parts = rel.split("/")
        if len(parts) > 3:  # _data/<version>/<name>/<file...>
            areas.setdefault("/".join(parts[:3]), set()).add(version)
    return areas


def _named_files(versions: list[VersionInfo]) -> dict[str, str]:
    """``{"_data/<version>/<name>/<file>": the version whose record lists it}``. An adopted
    version's files are outside the store (``formats/external.py``): never gc's."""
    return {
        rel: info.version
        for info in versions
        if info.external is None
        for rel in info.files
        if rel.startswith(DATA_DIR + "/")
    }


def _intent_files(store: GalleryStore, area: str, now: float, retention_s: float) -> set[str]:
    """The files (gallery-relative) that the area's commit intents younger than the retention
    name: a commit may be about to list them. An unreadable intent protects the whole area."""
    named: set[str] = set()
    selector = pafs.FileSelector(join(area, INTENT_DIR), allow_not_found=True)
    for entry in store.filesystem.get_file_info(selector):
        if entry.type != pafs.FileType.File or _mtime(entry) < now - retention_s:
            continue
        try:
            named.update(json.loads(store.backend.read(entry.path)).get("files", []))
        except FileNotFoundError:
            continue
        except (ValueError, AttributeError, TypeError):
            named.add("*")
    return named


def _mtime(entry: pafs.FileInfo) -> float:
    """A file's modification time; where the filesystem gives none (pyarrow over fsspec), the
    file counts as new: gc never deletes what it cannot date."""
    return entry.mtime.timestamp() if entry.mtime else math.inf


def _protected(rel_area: str, rel: str, named: Collection[str]) -> bool:
    """Whether the file ``rel`` (relative to its staging area ``rel_area``) is named in
    ``named`` (gallery-relative paths), or is the part record of a file that is."""
    if "*" in named:
        return True
    if rel.startswith(PARTS_DIR + "/"):
        rel = rel.removeprefix(PARTS_DIR + "/").removesuffix(".json")
    return f"{rel_area}/{rel}" in named


def _leftover(rel: str) -> bool:
    """In a published version's area, what may go: a temporary file, a part file or a part
    record (those the record lists are protected by name); never its lease or metadata."""
    return _loose(rel) or (rel.startswith(PARTS_DIR + "/") and rel.endswith(".json"))


def _area_files(fs: pafs.FileSystem, area: str, published: bool) -> list[tuple[str, int, float]]:
    """``[(path, bytes, mtime)]`` of a staging area's files: every file, or only the
    leftovers of a published version's area."""
    found = []
    selector = pafs.FileSelector(area, recursive=True, allow_not_found=True)
    for entry in fs.get_file_info(selector):
        rel = entry.path[len(area) + 1 :]
        if entry.type == pafs.FileType.File and not (published and not _leftover(rel)):
            found.append((entry.path, entry.size or 0, _mtime(entry)))
    return found


def _loose(rel: str) -> bool:
    """What may go from an area that keeps other files: temporary and part files. Its lease,
    part records and metadata stay with what is kept, so a later gc still knows the area."""
    return rel.startswith("_tmp/") or ("/" not in rel and not rel.startswith(("_", ".")))


# gallery -> {version: {how: [models]}}: what live models serve there or may roll back to
Served = Callable[[str], Mapping[str, Mapping[str, Sequence[str]]]]


class _Planner:
    def __init__(
        self,
        store: GalleryStore,
        older_than_s: float,
        keep_versions: int | None,
        served: Served | None,
    ):
        self.store, self.fs = store, store.filesystem
        self.now, self.older_than_s = time.time(), older_than_s
        self.keep_versions, self.served = keep_versions, served
        self.plan = GcPlan()

    def keep(self, kind: str, gallery: str, what: str, reason: str) -> None:
        self.plan.kept.append(GcKeep(kind, gallery, what, reason))

    def add(self, kind: str, gallery: str, path: str, reason: str) -> bool:
        """Plan to delete ``path`` if everything under it is older than ``older_than_s``."""
        found = _tree(self.fs, path)
        if found is None:
            return False
        newest, size, _ = found
        what = f"{gallery}/{path[len(self.store.path(gallery)) + 1 :]}"
        if newest > self.now - self.older_than_s:
            young = f"newest file {span(self.now - newest)} old"
            self.keep(kind, gallery, what, f"{young}, younger than --older-than {self.span}")
            return False
        uri = self.store.backend.uri(path)
        self.plan.items.append(GcItem(kind, gallery, path, uri, reason, size))
        return True

    @property
    def span(self) -> str:
        return span(self.older_than_s)

    def gallery(self, gallery: str) -> None:
        versions = self.store.versions(gallery)
        published = {v.version for v in versions}
        removed = set()
        for version in self._old_versions(gallery, versions):
            record = self.store.path(gallery, VERSIONS_DIR, version + ".json")
            if self.add("version", gallery, record, f"superseded (keep {self.keep_versions})"):
                removed.add(version)
        named = _named_files([v for v in versions if v.version not in removed])
        areas = _by_area(named)
        gone = _by_area(_named_files([v for v in versions if v.version in removed]))
        for vdir in _children(self.fs, self.store.path(gallery, DATA_DIR)):
            if vdir.type != pafs.FileType.Directory:
                continue  # a stray file, not a version's folder
            for sdir in _children(self.fs, vdir.path):
                if sdir.type == pafs.FileType.Directory:
                    rel = f"{DATA_DIR}/{vdir.base_name}/{sdir.base_name}"
                    race = vdir.base_name in published
                    self._staging(gallery, rel, sdir.path, (named, areas, gone), race)
        self._indexes(gallery, published - removed)

    def _staging(self, gallery: str, rel: str, path: str, names: tuple, race: bool) -> None:
        what, (named, areas, gone) = f"{gallery}/{rel}", names
        if self.fs.get_file_info(join(path, LEASE_DIR)).type != pafs.FileType.Directory:
            self.keep("staging", gallery, what, "no _lease/: not a staging area of this store")
            return
        if rel in areas:  # a version record names files under it: only its leftovers may go
            by = ", ".join(sorted(areas[rel]))
            self.keep("staging", gallery, what, f"named by version {by}")
            self._files("tmp", gallery, rel, path, "killed writers' files", named.keys())
            return
        why = self._lease_verdict(gallery, what, join(path, LEASE_DIR))
        if why is None:
            return
        of = sorted(gone.get(rel, ()))
        lost = "lost the publish race" if race else "abandoned"
        reason = f"files of removed {', '.join(of)}" if of else f"{lost}, {why}"
        self._files("staging", gallery, rel, path, reason, None)

    def _files(
        self, kind: str, gallery: str, rel: str, path: str, why: str, named: Collection[str] | None
    ) -> None:
        """Plan the area's files older than ``older_than_s`` that no version record (``named``,
        None for an area no record names) and no commit intent names."""
        found = _area_files(self.fs, path, named is not None)
        unnamed = [e for e in found if not _protected(rel, e[0][len(path) + 1 :], named or set())]
        intents = _intent_files(self.store, path, self.now, self.older_than_s)
        oldest = self.now - self.older_than_s
        files = [
            (f, n)
            for f, n, mtime in unnamed
            if mtime < oldest and not _protected(rel, f[len(path) + 1 :], intents)
        ]
        if len(files) < len(unnamed):
            kept = len(unnamed) - len(files)
            why_kept = f"younger than --older-than {self.span} or named by a commit in flight"
            self.keep(kind, gallery, f"{gallery}/{rel}", f"{kept} file(s) {why_kept}")
            if named is None:  # the area stays: keep what lets a later gc know it
                files = [(f, n) for f, n in files if _loose(f[len(path) + 1 :])]
        if files:
            paths, size = tuple(f for f, _ in files), sum(n for _, n in files)
            uri = self.store.backend.uri(path)
            self.plan.items.append(GcItem(kind, gallery, path, uri, why, size, paths))

    def _lease_verdict(self, gallery: str, what: str, lease_dir: str) -> str | None:
        """Why an unnamed staging area's lease no longer protects it, or None (kept)."""
        try:
            record = read_newest(self.store.backend, lease_dir)
        except (StoreError, OSError) as error:
            self.keep("staging", gallery, what, f"lease record unreadable ({error})")
            return None
        if record is None:
            return "no lease"  # its files' age alone decides
        ended = expired_at(self.store.backend, lease_dir, record)
        if ended is None:
            beat = span(self.now - record.heartbeat)
            live = f"lease live (job {record.owner.job!r}, heartbeat {beat} ago)"
            self.keep("staging", gallery, what, live)
            return None
        if self.now - ended <= self.older_than_s:
            how = "released" if record.released else "expired"
            young = f"lease {how} {span(self.now - ended)} ago"
            self.keep("staging", gallery, what, f"{young}, younger than --older-than {self.span}")
            return None
        return "lease not live"

    def _old_versions(self, gallery: str, versions: list[VersionInfo]) -> list[str]:
        """Versions past the newest K that nothing needs; a keep line for each other one."""
        if self.keep_versions is None or len(versions) <= self.keep_versions:
            return []
        by_name = {v.version: v for v in versions}
        needed, todo = set(), [versions[-1].version]
        while todo:  # the newest version's lineage, followed back
            name = todo.pop()
            if name in needed or name not in by_name:
                continue
            needed.add(name)
            rhs = by_name[name].lineage.partition("=")[2]
            todo.extend(t for t in _TOKEN.findall(rhs) if t in by_name)
        served = self.served(gallery)  # live models: aliases + grants - tombstones
        newest = {v.version for v in versions[-self.keep_versions :]}
        doomed = []
        for name in by_name:
            why = [f"{how} {', '.join(models)}" for how, models in served.get(name, {}).items()]
            why += [f"one of the newest {self.keep_versions}"] if name in newest else []
            if name in needed - newest:
                why.append(f"on the lineage of {versions[-1].version}")
            if why:
                self.keep("version", gallery, f"{gallery}/{name}", "; ".join(why))
            else:
                doomed.append(name)
        return doomed

    def _indexes(self, gallery: str, live: set[str]) -> None:
        index = self.store.path(gallery, INDEX_DIR)
        for entry in _children(self.fs, index):
            if entry.type != pafs.FileType.Directory or not SAFE_NAME.fullmatch(entry.base_name):
                continue
            version, current = entry.base_name, None
            if version not in live:
                self.add("index", gallery, entry.path, "its version is not published")
                self.add("index", gallery, f"{entry.path}.json", "its version is not published")
                continue
            try:
                with self.fs.open_input_stream(f"{entry.path}.json") as handle:
                    current = json.loads(handle.read()).get("build")
            except (FileNotFoundError, ValueError, AttributeError):
                what, why = f"{gallery}/{INDEX_DIR}/{version}", "no readable pointer"
                self.keep("index", gallery, what, f"{why}: its builds are the operator's call")
                continue
            for build in _children(self.fs, entry.path):
                if build.type == pafs.FileType.Directory and build.base_name != current:
                    self.add("index", gallery, build.path, "not the build its pointer names")


def check_arguments(
    store: GalleryStore,
    older_than_s: float | None,
    keep_versions: int | None,
    served: Served | None = None,
) -> float:
    """``older_than_s``, or the store's retention when None; :class:`GcArgumentError` unless
    it is at least the store's retention (``retention.py``: a file younger than that may be
    what a stalled writer is about to publish), ``keep_versions`` >= 1, and ``served`` is
    given with ``keep_versions`` (without it gc could not tell a served version from a
    superseded one)."""
    if keep_versions is not None and keep_versions < 1:
        raise GcArgumentError(
            f"--keep-versions: keep_versions >= 1 is required, got {keep_versions}"
        )
    if keep_versions is not None and served is None:
        raise GcArgumentError(
            "keep_versions needs served, what each gallery's live models serve "
            "(raycompat.serving.serving_map.serving_map): gc deletes no version without it"
        )
    retention = store.retention_s
    if older_than_s is None:
        return retention
    if not older_than_s >= retention:
        raise GcArgumentError(
            f"--older-than {span(older_than_s)} is shorter than the store's retention "
            f"{span(retention)} (set in its {MARKER_NAME} when it was created): a file younger "
            f"than that may be what a stalled writer is about to publish; use --older-than "
            f"{retention:g}s or more, or leave it out"
        )
    return older_than_s


def make_plan(
    store: GalleryStore,
    older_than_s: float | None = None,
    keep_versions: int | None = None,
    served: Served | None = None,
) -> GcPlan:
    """What :func:`collect` would delete, and each candidate it keeps with its reason (see the
    module docstring); deletes nothing. ``older_than_s`` defaults to the store's retention.
    ``served(gallery)``: ``{version: {how: [models]}}``, what live models serve on the gallery
    or may roll back to (``raycompat.serving.serving_map.serving_map``, bound to the store);
    read only for a gallery with more than ``keep_versions`` versions, and required with it.

    Raises:
        GcArgumentError: see :func:`check_arguments`.
        UnmarkedStoreError: the root has no store marker.
    """
    require_marker(store.backend, "gc")
    older_than_s = check_arguments(store, older_than_s, keep_versions, served)
    planner = _Planner(store, older_than_s, keep_versions, served)
    galleries = registered_galleries(store.backend)
    for entry in _children(store.filesystem, store.path()):
        name = entry.base_name
        if entry.type == pafs.FileType.Directory and name in galleries:
            planner.gallery(name)
        elif entry.type == pafs.FileType.Directory and not name.startswith("_"):
            why = f"not a gallery this store created (no {GALLERIES_DIR}/{name}.json)"
            planner.keep("folder", name, name, why)
    return planner.plan


def plan_gc(
    store: GalleryStore,
    older_than_s: float | None = None,
    keep_versions: int | None = None,
    served: Served | None = None,
) -> list[GcItem]:
    """The items of :func:`make_plan` (what :func:`collect` would delete)."""
    return make_plan(store, older_than_s, keep_versions, served).items


def collect(store: GalleryStore, items: list[GcItem]) -> int:
    """Delete ``items`` (versions first: their records); returns the bytes freed. The store
    marker is checked again; before each staging area's files are deleted, the gallery's
    version records and the area's commit intents are read again and a file they name now is
    kept, and an area whose lease a job has taken since is kept whole."""
    require_marker(store.backend, "gc")
    fs, freed = store.filesystem, 0
    order = {"version": 0, "staging": 1, "tmp": 2, "index": 3}
    for item in sorted(items, key=lambda i: order[i.kind]):
        if item.kind == "version":
            fs.delete_file(item.path)  # unpublished from here on; its files follow
            freed += item.bytes
            logger.info("gc: unpublished %s (%s)", item.uri, item.reason)
        elif item.kind in ("staging", "tmp"):
            freed += _collect_area(store, item)
        else:
            info = fs.get_file_info(item.path)
            if info.type == pafs.FileType.Directory:
                fs.delete_dir(item.path)
            elif info.type == pafs.FileType.File:
                fs.delete_file(item.path)
            freed += item.bytes
            logger.info("gc: removed %s %s (%s)", item.kind, item.uri, item.reason)
    return freed


def _collect_area(store: GalleryStore, item: GcItem) -> int:
    """Delete the planned files of one staging area that nothing names now; the bytes freed."""
    if item.kind == "staging" and _lease_live(store, item.path):
        logger.info("gc: %s was taken by a job since it was planned; kept", item.uri)
        return 0
    gallery_path = store.path(item.gallery)
    rel_area = item.path[len(gallery_path) + 1 :]
    named = set(_named_files(store.versions(item.gallery)))  # re-read just before deleting
    named |= _intent_files(store, item.path, time.time(), store.retention_s)
    freed, kept = 0, 0
    for path in item.files:
        if _protected(rel_area, path[len(item.path) + 1 :], named):
            kept += 1
            continue
        try:
            size = store.filesystem.get_file_info(path).size or 0
            store.filesystem.delete_file(path)
            freed += size
        except FileNotFoundError:
            continue
    if store.backend.scheme == "file":
        _prune_empty(item.path)
    note = f", kept {kept} file(s) a record or commit names now" if kept else ""
    logger.info("gc: removed %s %s (%s)%s", item.kind, item.uri, item.reason, note)
    return freed


def _prune_empty(folder: str) -> None:
    """Remove the empty folders under ``folder`` and it, bottom up (local disk; ``rmdir``
    refuses a folder a writer has just put a file in, so nothing is lost)."""
    for parent, _, _ in sorted(os.walk(folder), key=lambda e: -len(e[0])):
        try:
            os.rmdir(parent)
        except OSError:
            pass
