"""The store marker: ``<root>/_raycompat_store.json`` says that a folder is a raycompat store.

    {"format": "raycompat.store/1", "created": "2026-01-02T03:04:05+00:00"}

Anything that deletes (``gc.py``) first proves the folder is a store, so that ``raycompat gc``
pointed at the wrong folder deletes nothing. Every writer marks the store on its first write,
create-if-absent (``Backend.create_exclusive``; of two racing writers one creates it, the other
finds it): ``GalleryStore.begin``, ``adopt.publish_adopted`` and the catalog's records. A store
written before markers existed gets one on its next write, or from ``raycompat mark-store``
(:func:`store_contents` says what makes a folder look like a store).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow.fs as pafs

from raycompat.io.filesystems import Backend
from raycompat.store.errors import CorruptFileError, MissingStoreError
from raycompat.store.manifest import VERSIONS_DIR, now_utc
from raycompat.store.paths import SAFE_NAME, join
from raycompat.store.records import load_object

MARKER_NAME = "_raycompat_store.json"
MARKER_FORMAT = "raycompat.store/1"
MODELS_DIR = "_models"  # the catalog's records (``catalog.py``, which imports this module)


class UnmarkedStoreError(MissingStoreError):
    """The folder holds no store marker: nothing there is provably the store's (exit 2)."""


@dataclass(frozen=True)
class StoreMarker:
    format: str
    created: str


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
    return StoreMarker(MARKER_FORMAT, str(raw.get("created", "")))


def ensure_marker(backend: Backend) -> bool:
    """Mark the root if it is not marked yet; True when this call wrote the marker."""
    path = marker_path(backend)
    if backend.filesystem.get_file_info(path).type == pafs.FileType.File:
        return False
    data = json.dumps({"format": MARKER_FORMAT, "created": now_utc()}, indent=1).encode()
    try:
        backend.create_exclusive(path, data)
    except FileExistsError:
        return False  # another writer marked it first
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
    fs, found = backend.filesystem, []
    for entry in fs.get_file_info(pafs.FileSelector(backend.root, allow_not_found=True)):
        if entry.type != pafs.FileType.Directory:
            continue
        if entry.base_name == MODELS_DIR:
            records = _json_files(fs, entry.path)
            found += [f"model catalog ({records} record(s))"] if records else []
        elif SAFE_NAME.fullmatch(entry.base_name):
            records = _json_files(fs, join(entry.path, VERSIONS_DIR))
            found += [f"gallery {entry.base_name} ({records} version(s))"] if records else []
    return found


def _json_files(fs: pafs.FileSystem, path: str) -> int:
    selector = pafs.FileSelector(path, allow_not_found=True)
    infos = fs.get_file_info(selector)
    return sum(i.type == pafs.FileType.File and i.base_name.endswith(".json") for i in infos)
