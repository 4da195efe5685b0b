"""The stored ``label`` of a version's hits: for a one-shot search (:func:`labels_of`) and for a
long-lived reader (:class:`StoredLabels`: a gallery handle, ``raycompat/service/gallery.py``).

Only the rows of the hits' ids are read (``stored_rows.py``: one streamed scan keeping the
matches), so memory does not grow with the version's rows. Whether the version has a ``label``
column comes from its first file's footer (:func:`column_names`); a long-lived reader reads it
once, at the first lookup, and a version without one answers None for every hit from then on,
without reading anything.
"""

from __future__ import annotations

import threading

import numpy as np

from raycompat.serving.stored_rows import stored_rows
from raycompat.store import GalleryStore


def column_names(store: GalleryStore, gallery: str, version: str) -> list[str]:
    """The version's columns, from its first file's footer (no row is decoded)."""
    info = store.version(gallery, version)
    path, source = next(iter(store.version_files(gallery, info)))
    with store.open_file(info, path, source) as parquet:
        return parquet.schema_arrow.names


def labels_of(
    store: GalleryStore,
    gallery: str,
    version: str,
    ids: list[np.ndarray],
    labelled: bool | None = None,
) -> list:
    """Stored ``label`` of each id, per query (``ids``: one array per query; None where
    unlabelled). ``labelled``: whether the version has a ``label`` column, when the caller
    knows it already (None: read from its first file's footer)."""
    wanted = sorted({i for row in ids for i in row.tolist()})
    if labelled is None:
        labelled = bool(wanted) and "label" in column_names(store, gallery, version)
    if not wanted or not labelled:
        return [[None] * len(row) for row in ids]
    where, table = stored_rows(store, gallery, version, wanted, ["label"])
    labels = table.column("label").to_pylist()
    return [[labels[where[i]] if i in where else None for i in row.tolist()] for row in ids]


class StoredLabels:
    """The labels of ``gallery``/``version``'s hits (thread-safe)."""

    def __init__(self, store: GalleryStore, gallery: str, version: str) -> None:
        self.store, self.gallery, self.version = store, gallery, version
        self._lock = threading.Lock()
        self._labelled: bool | None = None  # None: not read yet

    def of(self, ids: list[np.ndarray]) -> list[list]:
        """The stored label of each id, per query (``ids``: one array per query, of the
        version's id type); None where unlabelled or no row holds the id."""
        if self._labelled is None:
            with self._lock:
                if self._labelled is None:
                    names = column_names(self.store, self.gallery, self.version)
                    self._labelled = "label" in names
        return labels_of(self.store, self.gallery, self.version, ids, self._labelled)
