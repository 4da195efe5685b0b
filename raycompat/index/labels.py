"""The stored ``label`` of a version's hits, for a long-lived reader (a gallery handle,
``raycompat/service/gallery.py``).

Whether the version has a ``label`` column is read once, from its first file's footer, at the
first lookup; a version without one answers None for every hit from then on, without reading
anything. A labelled version's hits are looked up per search as a one-shot search does
(:func:`raycompat.index.query.labels_of`: the rows of those ids only), so the reader's memory
does not grow with the version's rows.
"""

from __future__ import annotations

import threading

import numpy as np

from raycompat.store import GalleryStore


class StoredLabels:
    """The labels of ``gallery``/``version``'s hits (thread-safe)."""

    def __init__(self, store: GalleryStore, gallery: str, version: str) -> None:
        self.store, self.gallery, self.version = store, gallery, version
        self._lock = threading.Lock()
        self._labelled: bool | None = None  # None: not read yet

    def of(self, ids: list[np.ndarray]) -> list[list]:
        """The stored label of each id, per query (``ids``: one array per query, of the
        version's id type); None where unlabelled or no row holds the id."""
        from raycompat.index.query import column_names, labels_of

        if self._labelled is None:
            with self._lock:
                if self._labelled is None:
                    names = column_names(self.store, self.gallery, self.version)
                    self._labelled = "label" in names
        return labels_of(self.store, self.gallery, self.version, ids, self._labelled)
