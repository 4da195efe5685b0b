"""The store marker: ``<root>/_raycompat_store.json`` says that a folder is a raycompat store.

    {"format": "raycompat.store/1", "created": "2026-01-02T03:04:05+00:00",
     "retention_s": 604800}

Anything that deletes (``gc.py``) first proves the folder is a store, so that ``raycompat gc``
pointed at the wrong folder deletes nothing. The marker also fixes the store's **retention**
(``retention.py``): gc deletes nothing younger, and writers commit nothing older than half of
it. And it proves which galleries are the store's: each gallery a writer creates is registered
as ``<root>/_galleries/<gallery>.json`` (create-if-absent), and gc manages only those, never
another folder that happens to sit under the root. Every writer marks the store on its first write,
create-if-absent (``Backend.create_exclusive``; of two racing writers one creates it, the other
finds it): ``GalleryStore.begin``, ``adopt.publish_adopted`` and the catalog's records. A store
written before markers existed gets one on its next write, or from ``raycompat mark-store``
(:func:`store_contents` says what makes a folder look like a store).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow.fs as pafs

from raycompat.errors import CorruptFileError, MissingStoreError
from raycompat.io.filesystems import Backend
from raycompat.store.maintenance.retention import DEFAULT_RETENTION_S
from raycompat.store.manifest import VERSIONS_DIR, now_utc
from raycompat.store.paths import SAFE_NAME, check_name, join
from raycompat.store.records import load_object

MARKER_NAME = "_raycompat_store.json"
MARKER_FORMAT = "raycompat.store/1"
MODELS_DIR = "_models"  # the catalog's records (``catalog.py``, which imports this module)
GALLERIES_DIR = "_galleries"  # one record per gallery a writer of this store created


class UnmarkedStoreError(MissingStoreError):
    """The folder holds no store marker: nothing there is provably the store's (exit 2)."""


@dataclass(frozen=True)
class StoreMarker:
    format: str
    created: str
    retention_s: float = DEFAULT_RETENTION_S  # markers written before retention: the default


def marker_path(backend: Backend) -> str:
    return join(backend.root, MARKER_NAME)


def read_marker(backend: Backend) -> StoreMarker | None:
    """The root's marker, or None when it has none.

    Raises:
        CorruptFileError: the marker is not JSON, or of a format this version does not know
            (a newer raycompat wrote it: its gc may keep things this one would delete).
    """
    path = marker_path(backend)
    source = backend.uri(path)
    try:
        with backend.filesystem.open_input_stream(path) as handle:
            raw = load_object(handle.read(), source, "store marker")
    except FileNotFoundError:
        return None
    if raw.get("format") != MARKER_FORMAT:
        raise CorruptFileError(
            f"{source}: store marker format {raw.get('format')!r} is not {MARKER_FORMAT!r} "
            f"(written by another raycompat version?); refusing to manage this store"
        )
    retention = raw.get("retention_s", DEFAULT_RETENTION_S)
    if isinstance(retention, bool) or not isinstance(retention, int | float) or retention <= 0:
        raise CorruptFileError(f"{source}: retention_s must be a number > 0, got {retention!r}")
    return StoreMarker(MARKER_FORMAT, str(raw.get("created", "")), float(retention))


def ensure_marker(backend: Backend, retention_s: float = DEFAULT_RETENTION_S) -> bool:
    """Mark the root if it is not marked yet, with ``retention_s`` (``GalleryStore`` checked
    it against its lease timeout); True when this call wrote the marker. An existing marker is
    kept as it is: its retention is the store's."""
    raw = {"format": MARKER_FORMAT, "created": now_utc(), "retention_s": retention_s}
    return _create_once(backend, marker_path(backend), raw)


def _create_once(backend: Backend, path: str, raw: dict) -> bool:
    """Create the small record ``path`` unless it exists (create-if-absent: of two racing
    writers one creates it, the other finds it); True when this call created it."""
    if backend.filesystem.get_file_info(path).type == pafs.FileType.File:
        return False
    try:
        backend.create_exclusive(path, json.dumps(raw, indent=1).encode())
    except FileExistsError:
        return False
    return True


def require_marker(backend: Backend, action: str) -> StoreMarker:
    """The root's marker; :class:`UnmarkedStoreError` naming the folder when it has none."""
    marker = read_marker(backend)
    if marker is None:
        uri = backend.uri(backend.root)
        raise UnmarkedStoreError(
            f"{uri} is not a marked raycompat store (no {MARKER_NAME}), so {action} touches "
            f"nothing there; if it is a store, mark it with: raycompat mark-store --store {uri}"
        )
    return marker


def store_contents(backend: Backend) -> list[str]:
    """What makes the root look like a store: galleries with version records
    (``<gallery>/_versions/*.json``) and the model catalog (``_models/*.json``)."""
    catalog = _json_files(backend.filesystem, join(backend.root, MODELS_DIR))
    found = [f"model catalog ({catalog} record(s))"] if catalog else []
    found += [f"gallery {g} ({n} version(s))" for g, n in galleries_with_records(backend).items()]
    return found


def _json_files(fs: pafs.FileSystem, path: str) -> int:
    selector = pafs.FileSelector(path, allow_not_found=True)
    infos = fs.get_file_info(selector)
    return sum(i.type == pafs.FileType.File and i.base_name.endswith(".json") for i in infos)


def gallery_record(backend: Backend, gallery: str) -> str:
    return join(backend.root, GALLERIES_DIR, check_name("gallery", gallery) + ".json")


def register_gallery(backend: Backend, gallery: str) -> bool:
    """Record that this store created ``gallery`` (create-if-absent; the record is never
    rewritten); True when this call wrote it. Writers call it before a gallery's first file."""
    record = {"gallery": gallery, "created": now_utc()}
    return _create_once(backend, gallery_record(backend, gallery), record)


def registered_galleries(backend: Backend) -> list[str]:
    """The galleries this store created (``_galleries/*.json``), sorted."""
    selector = pafs.FileSelector(join(backend.root, GALLERIES_DIR), allow_not_found=True)
    names = [
        e.base_name.removesuffix(".json")
        for e in backend.filesystem.get_file_info(selector)
        if e.type == pafs.FileType.File and e.base_name.endswith(".json")
    ]
    return sorted(n for n in names if SAFE_NAME.fullmatch(n))


def galleries_with_records(backend: Backend) -> dict[str, int]:
    """``{gallery: how many version records}`` of the top-level folders holding any
    (``<gallery>/_versions/*.json``): what ``raycompat mark-store`` registers in a store
    written before gallery records existed."""
    fs, found = backend.filesystem, {}
    for entry in fs.get_file_info(pafs.FileSelector(backend.root, allow_not_found=True)):
        if entry.type == pafs.FileType.Directory and SAFE_NAME.fullmatch(entry.base_name):
            records = _json_files(fs, join(entry.path, VERSIONS_DIR))
            if records:
                found[entry.base_name] = records
    return found
