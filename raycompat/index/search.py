"""Nearest-neighbour search over a gallery: faiss indexes and a chunked torch reference.

``build_index`` returns a :class:`SearchIndex` whose ``search`` always gives scores where higher
is better (``-||q - g||^2`` for ``"l2"``, see :mod:`raycompat.index.distances`), padded with row -1
where fewer than k were found (:func:`real_hits` drops that padding). ``kind="flat"`` is exact;
``kind="ivfpq"`` is the approximate inverted-file + product-quantisation index used at gallery
scale; ``kind="sharded_ivf"`` is an inverted file of full vectors (IVF-Flat) whose size follows
:func:`ivf_nlist`, which the store fills shard by shard and merges on disk for large versions
(:mod:`raycompat.index.sharded`; ``build_index`` gives the same index in memory). With
``use_gpu="auto"`` the index is moved to the GPU when faiss was built with GPU support and a GPU
is visible, otherwise it stays on the CPU.

faiss prints some progress from C++ with ``printf`` (``IO_FLAG_ONDISK_SAME_DIR: updating ondisk
filename ...``, ``resizing ...``); :func:`stdout_to_stderr` sends it to stderr around those calls,
so a program's stdout carries only its own output (``raycompat search --json``).

The query path (``SearchIndex.search``) is NumPy and faiss only: queries are checked and
normalised by :meth:`Distance.prepare_numpy`, and this module does not import torch (only
:func:`brute_force_search` and index builds from tensors load it), so a search from the CLI
starts without it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raycompat.index.distances import Distance, check_same_width, get_distance

try:
    import faiss
except ImportError as _error:  # pragma: no cover - depends on the install
    raise ImportError(
        "raycompat.index.search needs faiss: install raycompat[cpu] (faiss-cpu) or raycompat[gpu] "
        "(faiss-gpu on CUDA nodes)"
    ) from _error
from raycompat.registry import Registry

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

INDEX_KINDS: Registry[faiss.Index] = Registry("index kind")


@INDEX_KINDS.register("flat")
def _flat(*, dim: int, metric: int, train: np.ndarray, seed: int, **_: Any) -> faiss.Index:
    return faiss.IndexFlat(dim, metric)


@INDEX_KINDS.register("ivfpq")
def _ivfpq(
    *,
    dim: int,
    metric: int,
    train: np.ndarray,
    seed: int,
    nlist: int | None = None,
    m: int | None = None,
    nbits: int = 8,
    **_: Any,
) -> faiss.Index:
    nlist = nlist or max(1, int(round(4 * math.sqrt(train.shape[0]))))
    m = m or max(s for s in range(1, min(dim, 32) + 1) if dim % s == 0)
    if dim % m:
        raise ValueError(f"ivfpq: m={m} sub-quantizers must divide the feature width {dim}")
    needed = max(nlist, 2**nbits)
    if train.shape[0] < needed:
        raise ValueError(
            f"ivfpq with nlist={nlist}, nbits={nbits} needs at least {needed} training vectors, "
            f"got {train.shape[0]}; lower nlist/nbits or use kind='flat'"
        )
    quantizer = faiss.IndexFlat(dim, metric)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, m, nbits, metric)
    index.cp.seed = seed
    index.pq.cp.seed = seed
    return index


SHARDED_IVF = "sharded_ivf"
MAX_NLIST = 65536
MIN_POINTS_PER_LIST = 39  # faiss' k-means warns below 39 training points per centroid


def _pow2_at_least(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1.0))))


def ivf_nlist(rows: int) -> int:
    """Inverted lists of a ``sharded_ivf`` index over ``rows`` vectors.

    ``nlist = next_pow2(4 sqrt(rows))``, at most 65536 and at most the largest power of two
    leaving 39 rows per list (so a sample of the whole version trains every centroid), at
    least 1: 1k rows -> 16, 100k -> 2048, 1M -> 4096, 16M -> 16384, 1B -> 65536.
    """
    most = min(MAX_NLIST, 1 << max(0, (rows // MIN_POINTS_PER_LIST).bit_length() - 1))
    return max(1, min(_pow2_at_least(4 * math.sqrt(rows)), most))


def ivf_nprobe(nlist: int) -> int:
    """Default lists visited per query: ``next_pow2(sqrt(nlist))``, at least 16 and at most
    ``nlist`` (4096 lists -> 64, 16384 -> 128, 65536 -> 256). A query then scans about
    ``rows / sqrt(nlist)`` vectors, so the search cost grows with the gallery as N^(3/4)."""
    return min(nlist, max(16, _pow2_at_least(math.sqrt(nlist))))


# The coarse quantizer of an IVF: exact ("flat", cost per assigned row ~ nlist d) or an HNSW
# graph over the centroids ("hnsw", faiss' IVF{nlist}_HNSW32; cost ~ log nlist). From 16384
# lists on, adding a row through the graph costs 0.41x (clustered rows) to 0.50x (rows uniform
# on the sphere, the hardest case) of flat's (benchmarks/ivf_quantizer.py, 1 thread, d = 32);
# at 8192 lists it is a wash (0.93x-1.04x, for 0.003-0.013 less recall@10), so flat stays
# below. Recall@10 is flat's once a search's efSearch is nprobe (0.903 vs 0.904 at 16384
# lists, nprobe 128; docs/scale.md). Rows are added with efSearch 8, not faiss' default 16: an
# add costs 0.58x (clustered) to 0.54x (uniform) of efSearch 16's, for 0.002 and 0.017 less
# recall@10 (0.903 vs 0.906; 0.517 vs 0.534; flat: 0.904 and 0.548).
QUANTIZERS = ("auto", "flat", "hnsw")
HNSW_MIN_NLIST = 16384
HNSW_M = 32
HNSW_EF_ADD = 8  # efSearch when adding (k = 1); a search uses max(HNSW_EF_ADD, nprobe)


def hnsw_params() -> dict:
    """How ``_sharded_ivf`` builds its HNSW quantizer (M, efSearch when adding), read when
    called: part of a sharded build's identity, so a build made with others is another folder."""
    return {"m": HNSW_M, "ef_add": HNSW_EF_ADD}


def ivf_quantizer(nlist: int, quantizer: str = "auto") -> str:
    """``"flat"`` or ``"hnsw"``: ``quantizer`` itself, or for ``"auto"`` HNSW from
    ``HNSW_MIN_NLIST`` lists on."""
    if quantizer not in QUANTIZERS:
        raise ValueError(f"quantizer must be one of {QUANTIZERS}, got {quantizer!r}")
    if quantizer == "auto":
        return "hnsw" if nlist >= HNSW_MIN_NLIST else "flat"
    return quantizer


@INDEX_KINDS.register(SHARDED_IVF)
def _sharded_ivf(
    *,
    dim: int,
    metric: int,
    train: np.ndarray,
    seed: int,
    nlist: int | None = None,
    quantizer: str = "auto",
    **_: Any,
) -> faiss.Index:
    nlist = nlist or ivf_nlist(train.shape[0])
    if train.shape[0] < nlist:
        raise ValueError(
            f"{SHARDED_IVF} with nlist={nlist} needs at least {nlist} training vectors, "
            f"got {train.shape[0]}"
        )
    # faiss trains an inner-product IVF with spherical k-means (unit centroids).
    if ivf_quantizer(nlist, quantizer) == "flat":
        index = faiss.IndexIVFFlat(faiss.IndexFlat(dim, metric), dim, nlist, metric)
    else:  # as index_factory's "IVF{nlist}_HNSW32": k-means with an exact assigner, then
        # the centroids go into the HNSW (quantizer_trains_alone = 2); same centroids as flat
        graph = faiss.IndexHNSWFlat(dim, HNSW_M, metric)
        graph.hnsw.efSearch = HNSW_EF_ADD
        index = faiss.IndexIVFFlat(graph, dim, nlist, metric)
        index.quantizer_trains_alone = 2
        index.clustering_index = exact = faiss.IndexFlat(dim, metric)
        index.referenced_objects.append(exact)  # alive while C++ points at it
    index.cp.seed = seed
    index.nprobe = ivf_nprobe(nlist)
    return index


def quantizer_ef(index: faiss.Index) -> int | None:
    """The ``efSearch`` of ``index``'s HNSW coarse quantizer; None for any other index."""
    try:
        coarse = faiss.downcast_index(faiss.extract_index_ivf(index).quantizer)
    except RuntimeError:  # not an IVF (flat), or a GPU index
        return None
    return int(coarse.hnsw.efSearch) if isinstance(coarse, faiss.IndexHNSW) else None


def gpu_available() -> bool:
    """True when this faiss build has GPU support and at least one GPU is visible."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def check_use_gpu(use_gpu: bool | str) -> None:
    if use_gpu not in (True, False, "auto"):
        raise ValueError(f"use_gpu must be True, False or 'auto', got {use_gpu!r}")


def resolve_gpu(use_gpu: bool | str) -> bool:
    """Whether faiss works on a GPU here: ``"auto"`` when one is visible; ``True`` demands one
    (``RuntimeError`` if faiss has none); ``False`` never."""
    check_use_gpu(use_gpu)
    if use_gpu == "auto":
        return gpu_available()
    if use_gpu and not gpu_available():
        raise RuntimeError("use_gpu=True but faiss has no GPU support or no GPU is visible")
    return bool(use_gpu)


_resolve_gpu = resolve_gpu  # the private name this module and older callers use


_LIBC = ctypes.CDLL(None)  # the process's C library: its fflush empties printf's buffer


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Within the block, what this process writes to its stdout file descriptor (1) goes to
    stderr: faiss prints from C++ with ``printf``, past ``sys.stdout``. Python's and C's stdout
    buffers are flushed on entry and exit, so earlier output keeps its place and nothing printed
    inside reaches stdout later. Other threads' stdout writes in the block go to stderr too."""
    if sys.stdout is not None:
        sys.stdout.flush()
    _LIBC.fflush(None)
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        _LIBC.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


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


def _to_faiss(x: Any) -> np.ndarray:
    """A C-contiguous float32 array of ``x``: a NumPy array or a torch tensor."""
    if hasattr(x, "detach"):  # a tensor: its caller has loaded torch
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
        raw, indices = self.index.search(_to_faiss(q), int(k), params=params)
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
        if _resolve_gpu(use_gpu) and not self.on_gpu:
            self._to_gpu()

    def _to_gpu(self) -> None:
        self._gpu_resources = faiss.StandardGpuResources()
        self.index = faiss.index_cpu_to_gpu(self._gpu_resources, 0, self.index)
        self.on_gpu = True
        self._quantizer_ef = None  # faiss' GPU IVF has its own (flat) quantizer


def build_index(
    gallery: Any,
    distance: str | Distance = "cosine",
    kind: str = "flat",
    *,
    nlist: int | None = None,
    m: int | None = None,
    nbits: int = 8,
    train_size: int | None = None,
    nprobe: int | None = None,
    use_gpu: bool | str = "auto",
    seed: int = 0,
) -> SearchIndex:
    """Index ``(G, d)`` gallery features.

    Args:
        distance: a name in ``DISTANCES`` (``cosine``, ``l2``, ``inner_product``).
        kind: ``"flat"`` (exact), ``"ivfpq"`` or ``"sharded_ivf"``. ivfpq defaults:
            ``nlist = 4 sqrt(train_size)``, ``m`` = largest divisor of d up to 32, ``nbits = 8``,
            ``nprobe = min(nlist, 16)``; sharded_ivf: :func:`ivf_nlist`, :func:`ivf_nprobe`.
        train_size: rows (sampled with ``seed``) used to train ivfpq; default all.
    """
    dist = get_distance(distance)
    builder = INDEX_KINDS.get(kind)
    if kind == "flat":
        given = {
            k: v
            for k, v in dict(nlist=nlist, m=m, train_size=train_size, nprobe=nprobe).items()
            if v is not None
        }
        if given:
            raise ValueError(f"{sorted(given)} only apply to kind='ivfpq', not 'flat'")
    x = _to_faiss(dist.prepare_numpy(gallery, "gallery"))
    train = x
    if train_size is not None and train_size < x.shape[0]:
        rows = np.random.default_rng(seed).choice(x.shape[0], size=train_size, replace=False)
        train = x[np.sort(rows)]
    index = builder(
        dim=x.shape[1],
        metric=dist.faiss_metric,
        train=train,
        seed=seed,
        nlist=nlist,
        m=m,
        nbits=nbits,
    )
    if not index.is_trained:
        index.train(train)
    out = SearchIndex(index, dist, kind)
    if _resolve_gpu(use_gpu):
        out._to_gpu()
    out.index.add(x)
    if kind == "ivfpq" and nprobe is None:
        nprobe = min(index.nlist, 16)
    if nprobe is not None:  # sharded_ivf: its builder set ivf_nprobe(nlist)
        out.set_nprobe(nprobe)
    logger.info(
        "built %s index (%s) of %d x %d on %s",
        kind,
        dist.name,
        *x.shape,
        "gpu" if out.on_gpu else "cpu",
    )
    return out


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
