"""Build a :class:`~raycompat.index.search_index.SearchIndex` by kind: ``build_index``.

``INDEX_KINDS`` holds one builder per kind (an unknown kind lists the known ones):
``"flat"`` is exact; ``"ivfpq"`` is the approximate inverted-file + product-quantisation index
used at gallery scale; ``"sharded_ivf"`` is an inverted file of full vectors (IVF-Flat) whose
size follows :func:`raycompat.index.ivf.ivf_nlist`, which the store fills shard by shard and
merges on disk for large versions (:mod:`raycompat.index.sharded`; ``build_index`` gives the same
index in memory). ``use_gpu`` is resolved by :func:`raycompat.index.gpu.resolve_gpu`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import faiss
import numpy as np

from raycompat.index.distances import Distance, get_distance
from raycompat.index.ivf import (
    MIN_POINTS_PER_LIST,
    SHARDED_IVF,
    hnsw_params,
    ivf_nlist,
    ivf_nprobe,
    ivf_quantizer,
    kmeans_shortfall,
)
from raycompat.index.search_index import SearchIndex, to_faiss
from raycompat.registry import Registry

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
    rows = train.shape[0]
    short = kmeans_shortfall(index.cp, rows, nlist) + kmeans_shortfall(index.pq.cp, rows, 2**nbits)
    if short:
        logger.warning(
            "ivfpq: %d training vectors for %d lists and %d codes per sub-quantizer (k-means "
            "wants %d per centroid), so its codes may lose recall (`raycompat index build` "
            "reports its recall@10, `raycompat index verify` measures it again); --kind flat "
            "is exact (what --kind auto builds up to 100 000 rows)",
            rows,
            nlist,
            2**nbits,
            MIN_POINTS_PER_LIST,
        )
    return index


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
        hnsw = hnsw_params()  # read when called: a benchmark may set ivf.HNSW_EF_ADD
        graph = faiss.IndexHNSWFlat(dim, hnsw["m"], metric)
        graph.hnsw.efSearch = hnsw["ef_add"]
        index = faiss.IndexIVFFlat(graph, dim, nlist, metric)
        index.quantizer_trains_alone = 2
        index.clustering_index = exact = faiss.IndexFlat(dim, metric)
        index.referenced_objects.append(exact)  # alive while C++ points at it
    index.cp.seed = seed
    if kmeans_shortfall(index.cp, train.shape[0], nlist):
        logger.warning(
            "%s: %d training vectors for nlist=%d lists (k-means wants %d per list), so some "
            "lists may be poorly placed: a smaller --nlist, or none (its default fits the rows)",
            SHARDED_IVF,
            train.shape[0],
            nlist,
            MIN_POINTS_PER_LIST,
        )
    return index


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
            ``nlist = 4 sqrt(train_size)``, ``m`` = largest divisor of d up to 32, ``nbits = 8``;
            sharded_ivf: ``nlist`` :func:`ivf_nlist`. Both kinds: ``nprobe``
            :func:`ivf_nprobe` of their ``nlist`` (the one default, which the sharded build
            uses too).
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
    x = to_faiss(dist.prepare_numpy(gallery, "gallery"))
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
    out.place(use_gpu)
    out.index.add(x)
    if kind != "flat":
        out.set_nprobe(nprobe if nprobe is not None else ivf_nprobe(index.nlist))
    logger.debug(
        "built %s index (%s) of %d x %d on %s",
        kind,
        dist.name,
        *x.shape,
        "gpu" if out.on_gpu else "cpu",
    )
    return out
