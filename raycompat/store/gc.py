"""Garbage collection of a store: what killed jobs, rebuilt indexes and old versions leave.

    items = plan_gc(store, older_than_s=24 * 3600, keep_versions=3)
    for item in items: print(item.kind, item.uri, item.reason)
    collect(store, items)            # deletes; ``raycompat gc`` without ``--dry-run``

What is collected, per gallery (each only when older than ``older_than_s``, by the newest
modification time of anything under it):

- ``staging``: a staging area ``_data/<version>/<name>/`` that is not a published version's, and
  whose lease is absent, released or expired (a live job's staging area is never touched).
- ``tmp``: temporary part files under ``_tmp/`` of published versions' folders, left by writers
  killed before the commit (hidden: no reader sees them, and no writer will move them; an
  unpublished staging area's ``_tmp`` is removed by the next ``begin``, or with the area).
- ``index``: index builds ``_index/<version>/<build>/`` that the version's pointer does not name,
  and every index of a version that no longer exists.
- ``version``: with ``keep_versions=K``, published versions older than the newest K, unless a
  registered model may query them (a catalog grant) or the newest version's lineage names them
  (followed transitively). Its record is deleted first, so it is unpublished in one step, then
  its files and index.

Never collected: a published version's record or part files (except as a whole ``version``
item), part records, the model catalog, a staging area whose lease is live, and the files of an
adopted version (they are outside the store; removing such a version deletes its record only).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

import pyarrow.fs as pafs

from raycompat.store.catalog import Catalog
from raycompat.store.gallery import GalleryStore
from raycompat.store.lease import LEASE_DIR, read_newest
from raycompat.store.manifest import DATA_DIR, INDEX_DIR, VERSIONS_DIR, VersionInfo
from raycompat.store.paths import SAFE_NAME, join

logger = logging.getLogger(__name__)
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]*")


@dataclass(frozen=True)
class GcItem:
    """One thing to delete: ``kind`` (staging, tmp, index, version), its path and why."""

    kind: str
    gallery: str
    path: str
    uri: str
    reason: str
    bytes: int


def _children(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    return fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))


def _tree(fs: pafs.FileSystem, path: str) -> tuple[float, int, int] | None:
    """``(newest mtime in seconds, total bytes, files)`` of ``path`` (a file, or the files
    under a folder; an empty folder counts with its own mtime), or None if nothing is there."""
    top = fs.get_file_info(path)
    if top.type == pafs.FileType.NotFound:
        return None
    if top.type == pafs.FileType.File:
        return top.mtime.timestamp() if top.mtime else 0.0, top.size or 0, 1
    newest = top.mtime.timestamp() if top.mtime else 0.0
    size = files = 0
    for entry in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if entry.type == pafs.FileType.File:
            size, files = size + (entry.size or 0), files + 1
            if entry.mtime is not None:
                newest = max(newest, entry.mtime.timestamp())
    return newest, size, files


def _lease_live(store: GalleryStore, staging_path: str) -> bool:
    record = read_newest(store.backend, join(staging_path, LEASE_DIR))
    return record is not None and not record.expired()


class _Planner:
    def __init__(self, store: GalleryStore, older_than_s: float, keep_versions: int | None):
        self.store, self.fs = store, store.filesystem
        self.cutoff = time.time() - older_than_s
        self.keep_versions = keep_versions
        self.items: list[GcItem] = []

    def add(self, kind: str, gallery: str, path: str, reason: str) -> None:
        found = _tree(self.fs, path)
        if found is None or (kind == "tmp" and not found[2]):
            return
        newest, size, _ = found
        if newest <= self.cutoff:
            uri = self.store.backend.uri(path)
            self.items.append(GcItem(kind, gallery, path, uri, reason, size))

    def gallery(self, gallery: str) -> None:
        versions = self.store.versions(gallery)
        published = {v.version: v for v in versions}
        # An adopted version's files are outside the store (``external.py``): never gc's.
        owners = {f.rsplit("/", 1)[0] for v in versions if v.external is None for f in v.files}
        doomed = self._old_versions(gallery, versions)
        for version in doomed:
            record = self.store.path(gallery, VERSIONS_DIR, version + ".json")
            self.add("version", gallery, record, f"superseded (keep {self.keep_versions})")
        data = self.store.path(gallery, DATA_DIR)
        for vdir in _children(self.fs, data):
            for sdir in _children(self.fs, vdir.path):
                if sdir.type != pafs.FileType.Directory:
                    continue
                rel = f"{DATA_DIR}/{vdir.base_name}/{sdir.base_name}"
                if rel not in owners and _lease_live(self.store, sdir.path):
                    continue  # a job is writing it (a published version's lease is moot)
                if rel in owners and vdir.base_name not in doomed:
                    self.add("tmp", gallery, join(sdir.path, "_tmp"), "killed writers' files")
                elif rel in owners:
                    self.add("staging", gallery, sdir.path, f"files of removed {vdir.base_name}")
                else:
                    why = "lost the publish race" if vdir.base_name in published else "abandoned"
                    self.add("staging", gallery, sdir.path, f"{why}, lease not live")
        self._indexes(gallery, set(published) - set(doomed))

    def _old_versions(self, gallery: str, versions: list[VersionInfo]) -> list[str]:
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
        served = {g.gallery_version for g in Catalog(self.store).grants(gallery)}
        kept = {v.version for v in versions[-self.keep_versions :]} if self.keep_versions else set()
        return [v.version for v in versions if v.version not in kept | needed | served]

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
                continue  # no readable pointer: leave the builds for the operator
            for build in _children(self.fs, entry.path):
                if build.type == pafs.FileType.Directory and build.base_name != current:
                    self.add("index", gallery, build.path, "not the build its pointer names")


def plan_gc(
    store: GalleryStore, older_than_s: float = 24 * 3600, keep_versions: int | None = None
) -> list[GcItem]:
    """What :func:`collect` would delete (see the module docstring); deletes nothing."""
    if older_than_s < 0 or (keep_versions is not None and keep_versions < 1):
        raise ValueError("older_than_s must be >= 0 and keep_versions >= 1 (or None)")
    planner = _Planner(store, older_than_s, keep_versions)
    for entry in _children(store.filesystem, store.path()):
        if entry.type == pafs.FileType.Directory and SAFE_NAME.fullmatch(entry.base_name):
            planner.gallery(entry.base_name)
    return planner.items


def collect(store: GalleryStore, items: list[GcItem]) -> int:
    """Delete ``items`` (versions first: record, then files); returns the bytes freed."""
    fs, freed = store.filesystem, 0
    order = {"version": 0, "staging": 1, "tmp": 2, "index": 3}
    for item in sorted(items, key=lambda i: order[i.kind]):
        if item.kind == "version":
            fs.delete_file(item.path)  # unpublished from here on; its files follow
            freed += item.bytes
            logger.info("gc: unpublished %s (%s)", item.uri, item.reason)
            continue
        if item.kind == "staging" and _lease_live(store, item.path):
            logger.info("gc: %s was taken by a job since it was planned; kept", item.uri)
            continue
        info = fs.get_file_info(item.path)
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(item.path)
        elif info.type == pafs.FileType.File:
            fs.delete_file(item.path)
        freed += item.bytes
        logger.info("gc: removed %s %s (%s)", item.kind, item.uri, item.reason)
    return freed
