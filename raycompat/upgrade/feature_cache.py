"""The test features of an upgrade history's models, in matrix order, and their cache (no Ray).

The job scores every model of the history on the same test images; a model's ``(N, d)``
features are its row of the compatibility matrix (``history_matrix`` of
:mod:`raycompat.upgrade.evaluate` takes a :class:`FeatureCache` as its mapping). A published model's
features are also kept in the work dir, ``<directory>/<model>.npy``, so that a rerun scores its
row from the same numbers: re-embedding in another process may round differently and flip
near-ties.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence

import numpy as np


class FeatureCache(Mapping[str, np.ndarray]):
    """Model version -> its ``(N, d)`` test features, iterated in the order the models joined
    the matrix; :meth:`keep` writes a model's features to ``directory``, :meth:`cached` reads
    them back."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.order: list[str] = []
        self._features: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        return self._features[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)

    def add(self, name: str, features: np.ndarray) -> None:
        """``name``'s row of the matrix: a new model goes last, a known one keeps its place."""
        if name not in self._features:
            self.order.append(name)
        self._features[name] = features

    def path(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.npy")

    def is_cached(self, name: str) -> bool:
        return os.path.isfile(self.path(name))

    def cached(self, name: str) -> np.ndarray | None:
        """The features kept for ``name``, or None."""
        return np.load(self.path(name), allow_pickle=False) if self.is_cached(name) else None

    def keep(self, name: str, features: np.ndarray) -> None:
        """Keep the test features a published model was scored with, unless kept already.
        Written once, whole (a temporary file renamed)."""
        if self.is_cached(name):
            return
        os.makedirs(self.directory, exist_ok=True)
        partial = f"{self.path(name)}.{os.getpid()}.tmp.npy"
        np.save(partial, features)
        os.replace(partial, self.path(name))

    def planar(self, labels: Sequence) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Name -> ``(features, labels)`` of the models whose features are 2-d (the report's
        feature plots)."""
        labels = np.asarray(labels)
        return {n: (f, labels) for n, f in self.items() if f.shape[1] == 2}
