"""The stored ``label`` of a version's ids, read once and looked up per search.

A one-shot search reads the labels of its hits with one scan of the version
(:func:`raycompat.index.query.labels_of`); a long-lived one (a gallery handle,
``raycompat/service/gallery.py``) reads the ``id`` and ``label`` columns once, at its first
lookup, and answers every later one from memory: the ids sorted, the labels in that order, a
binary search per hit (memory: one id and one label per row). A version without a ``label``
column reads only its first file's footer and answers None for every hit, as ``labels_of``
does.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from raycompat.store import GalleryStore
from raycompat.store.mapped_ids import int64_values


class StoredLabels:
    """The labels of ``gallery``/``version``, read at the first :meth:`of` (thread-safe)."""

    def __init__(self, store: GalleryStore, gallery: str, version: str) -> None:
        self.store, self.gallery, self.version = store, gallery, version
        self._lock = threading.Lock()
        self._read = False
        self._ids: np.ndarray | None = None  # sorted; None: the version has no label column
        self._labels: list = []

    def of(self, ids: list[np.ndarray]) -> list[list]:
        """The stored label of each id, per query (``ids``: one array per query, of the
        version's id type); None where unlabelled or no row holds the id."""
        self._load()
        if self._ids is None or not len(self._ids):
            return [[None] * len(row) for row in ids]
        out = []
        for row in ids:
            at = np.searchsorted(self._ids, row).clip(max=len(self._ids) - 1)
            found = (self._ids[at] == row).tolist()
            pairs = zip(at.tolist(), found, strict=True)
            out.append([self._labels[a] if hit else None for a, hit in pairs])
        return out

    def _load(self) -> None:
        if self._read:
            return
        from raycompat.index.query import column_names

        with self._lock:
            if self._read:
                return
            if "label" in column_names(self.store, self.gallery, self.version):
                self._ids, self._labels = self._sorted()
            self._read = True

    def _sorted(self) -> tuple[np.ndarray, list]:
        ids, labels = [], []
        for batch in self.store.iter_batches(self.gallery, self.version, columns=["id", "label"]):
            ids.append(batch.column("id"))
            labels.append(batch.column("label"))
        column = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
        if pa.types.is_integer(column.type):
            found = int64_values(column)
        else:
            found = np.array(column.to_pylist(), dtype=object)
        order = np.argsort(found, kind="stable")
        values = pa.concat_arrays(labels).to_pylist() if labels else []
        return found[order], [values[i] for i in order.tolist()]
