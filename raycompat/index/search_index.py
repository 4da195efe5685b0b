"""Nearest-neighbour search over a gallery: a faiss index (:class:`SearchIndex`) and a chunked
torch reference (:func:`brute_force_search`).

``SearchIndex.search`` always gives scores where higher is better (``-||q - g||^2`` for
``"l2"``, see :mod:`raycompat.index.distances`), padded with row -1 where fewer than k were found
(:func:`real_hits` drops that padding). :func:`raycompat.index.factory.build_index` builds one
by kind; :mod:`raycompat.index.ivf` sizes the inverted-file kinds; :mod:`raycompat.index.gpu`
decides whether it lives on a GPU (``use_gpu="auto"``: when faiss was built with GPU support and
a GPU is visible).

The query path (``SearchIndex.search``) is NumPy and faiss only: queries are checked and
normalised by :meth:`Distance.prepare_numpy`, and this module does not import torch (only
:func:`brute_force_search` and index builds from tensors load it), so a search from the CLI
starts without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import faiss
except ImportError as _error:  # pragma: no cover - depends on the install
    raise ImportError(
        "raycompat.index.search_index needs faiss: install raycompat[cpu] (faiss-cpu) or "
        "raycompat[gpu] (faiss-gpu on CUDA nodes)"
    ) from _error
from raycompat.index.distances import Distance, check_same_width, get_distance
from raycompat.index.gpu import resolve_gpu
from raycompat.index.ivf import SHARDED_IVF, quantizer_ef

if TYPE_CHECKING:
    import torch


def real_hits(
    scores: np.ndarray, rows: np.ndarray, ids: Any = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per query, ``(scores (n,), rows (n,))`` of the items found, ``n <= k``, best first:
    ``scores, rows (Q, k)`` of :meth:`SearchIndex.search` without faiss's padding (row -1).
    ``ids``: row -> id (an array, or anything indexed by an int array); given, the found rows
    are mapped to ids (in one lookup) after the padding is dropped, so an id may be -1."""
    keep = rows >= 0
    if keep.all():  # the common case: one gather, then row views (no split)
        found = rows if ids is None else ids[rows]
        return list(zip(scores, found, strict=True))
    found = rows[keep] if ids is None else ids[rows[keep]]
    splits = np.cumsum(keep.sum(axis=1))[:-1]
    return list(zip(np.split(scores[keep], splits), np.split(found, splits), strict=True))


def to_faiss(x: Any) -> np.ndarray:
    """A C-contiguous float32 array of ``x``: a NumPy array or a torch tensor."""
    if type(x) is not np.ndarray and hasattr(x, "detach"):  # a tensor: its caller has torch
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(x, dtype=np.float32)


class SearchIndex:
    """A faiss index plus the distance it was built for."""

    def __init__(self, index: faiss.Index, distance: Distance, kind: str, on_gpu: bool = False):
        self.index, self.distance, self.kind, self.on_gpu = index, distance, kind, on_gpu
        self._gpu_resources = None
        self._quantizer_ef = None if on_gpu else quantizer_ef(index)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    @property
    def is_ivf(self) -> bool:
        """Whether the index has inverted lists (``nprobe`` applies)."""
        return hasattr(self.index, "nprobe")

    def _check_nprobe(self, nprobe: int) -> int:
        if not self.is_ivf:
            raise ValueError(
                f"nprobe only applies to kind='ivfpq' or '{SHARDED_IVF}', this index is "
                f"{self.kind!r}"
            )
        if int(nprobe) < 1:
            raise ValueError(f"nprobe must be >= 1, got {nprobe}")
        return int(nprobe)

    def set_nprobe(self, nprobe: int) -> None:
        """Number of inverted lists visited per query from now on (IVF kinds only)."""
        self.index.nprobe = self._check_nprobe(nprobe)

    def search(
        self, queries: Any, k: int, nprobe: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k gallery items per query.

        Args:
            queries: ``(Q, d)`` raw features (``prepare`` is applied here).
            k: ``1 <= k <= ntotal``.
            nprobe: inverted lists visited for this call (IVF kinds); default the index's.
        Returns:
            ``scores (Q, k)`` float32, higher is better, best first; ``indices (Q, k)`` int64 into
            the gallery. An approximate index that finds fewer than k items (its probed lists
            hold fewer) pads with index -1 and score -inf; :func:`real_hits` drops them.
        Raises:
            ZeroNormError: a cosine index got query rows of zero norm (named in the message);
                ``l2`` and ``inner_product`` answer them.
        """
        if not 1 <= int(k) <= self.ntotal:
            raise ValueError(f"k must be in [1, ntotal={self.ntotal}], got {k}")
        q = self.distance.prepare_numpy(queries, "queries", refuse_zero=True)
        if q.shape[1] != self.dim:
            raise ValueError(f"queries have width {q.shape[1]}, the index holds width {self.dim}")
        params = None
        if nprobe is not None or self._quantizer_ef is not None:
            params = self._ivf_params(self.index.nprobe if nprobe is None else nprobe)
        raw, indices = self.index.search(to_faiss(q), int(k), params=params)
        scores = self.distance.from_faiss(raw).astype(np.float32, copy=False)
        scores[indices < 0] = -np.inf
        return scores, indices.astype(np.int64, copy=False)

    def _ivf_params(self, nprobe: int) -> faiss.SearchParametersIVF:
        """``nprobe`` for one call; an HNSW coarse quantizer must then find ``nprobe`` lists,
        so it searches with ``efSearch = max(its own, nprobe)`` (with less, recall@10 drops:
        0.851 against 0.883 at 4096 lists, nprobe 64, efSearch 16; docs/scale.md)."""
        nprobe = self._check_nprobe(nprobe)
        if self._quantizer_ef is None:
            return faiss.SearchParametersIVF(nprobe=nprobe)
        graph = faiss.SearchParametersHNSW(efSearch=max(self._quantizer_ef, nprobe))
        params = faiss.SearchParametersIVF(nprobe=nprobe, quantizer_params=graph)
        params.referenced_objects = [graph]  # C++ holds a bare pointer to it
        return params

    def save(self, path: str | Path) -> None:
        """Write the index to ``path`` and its distance/kind to ``path + '.json'``."""
        index = faiss.index_gpu_to_cpu(self.index) if self.on_gpu else self.index
        faiss.write_index(index, str(path))
        meta = {"distance": self.distance.name, "kind": self.kind}
        Path(f"{path}.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, path: str | Path, use_gpu: bool | str = "auto") -> SearchIndex:
        for p in (Path(path), Path(f"{path}.json")):
            if not p.is_file():
                raise FileNotFoundError(f"search index file {p} does not exist")
        meta = json.loads(Path(f"{path}.json").read_text())
        missing = {"distance", "kind"} - set(meta)
        if missing:
            raise KeyError(f"{path}.json lacks key(s) {sorted(missing)}")
        out = cls(faiss.read_index(str(path)), get_distance(meta["distance"]), meta["kind"])
        out.place(use_gpu)
        return out

    def place(self, use_gpu: bool | str = "auto") -> None:
        """Move a CPU index to the GPU when ``use_gpu`` says so (``"auto"``: if one is visible)."""
        if resolve_gpu(use_gpu) and not self.on_gpu:
            self._to_gpu()

    def _to_gpu(self) -> None:
        self._gpu_resources = faiss.StandardGpuResources()
        self.index = faiss.index_cpu_to_gpu(self._gpu_resources, 0, self.index)
        self.on_gpu = True
        self._quantizer_ef = None  # faiss' GPU IVF has its own (flat) quantizer


def brute_force_search(
    queries: Any, gallery: Any, k: int, distance: str | Distance = "cosine", chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by chunked torch matmul; never holds more than ``chunk_size x G`` scores.

    Returns:
        ``scores (Q, k)`` and ``indices (Q, k)`` (int64), best first. Ties are broken arbitrarily.
    """
    import torch

    dist = get_distance(distance)
    q, g = dist.prepare(queries, "queries"), dist.prepare(gallery, "gallery")
    check_same_width(q, g)
    if not 1 <= int(k) <= g.shape[0]:
        raise ValueError(f"k must be in [1, gallery size={g.shape[0]}], got {k}")
    parts = [
        dist.scores(q[s : s + chunk_size], g).topk(int(k), dim=1)
        for s in range(0, q.shape[0], chunk_size)
    ]
    return torch.cat([p.values for p in parts]), torch.cat([p.indices for p in parts])
