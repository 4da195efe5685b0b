"""Sizes of an inverted-file index: lists (``nlist``), lists probed (``nprobe``), coarse quantizer.

``SHARDED_IVF`` is the inverted file of full vectors (IVF-Flat) that the store fills shard by
shard (:mod:`raycompat.index.sharded`) and :func:`raycompat.index.factory.build_index` builds in
memory; its ``nlist`` follows :func:`ivf_nlist`, its default ``nprobe`` :func:`ivf_nprobe`, and
its coarse quantizer :func:`ivf_quantizer` (exact, or an HNSW graph over the centroids).
"""

from __future__ import annotations

import math

import faiss

SHARDED_IVF = "sharded_ivf"
MAX_NLIST = 65536
MIN_POINTS_PER_LIST = 39  # faiss' k-means warns below 39 training points per centroid


def kmeans_shortfall(clustering: faiss.ClusteringParameters, rows: int, centroids: int) -> int:
    """How many training rows short of ``MIN_POINTS_PER_LIST`` per centroid a k-means of
    ``rows`` into ``centroids`` is (0: none), with faiss' own warning about it turned off in
    ``clustering`` (an index's ``cp``, a PQ's ``pq.cp``). faiss prints "WARNING clustering N
    points to K centroids: please provide at least M training points" from C++, past logging,
    once per k-means (8 lines for a PQ of 8 sub-quantizers); its threshold decides only that
    print, not the centroids. The builder says it once, in our words, when it matters."""
    clustering.min_points_per_centroid = 1
    return max(0, MIN_POINTS_PER_LIST * centroids - rows)


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
    """Default lists visited per query, of every IVF kind (``ivfpq`` and ``sharded_ivf`` built
    in memory by ``build_index``, a sharded build's plan): ``next_pow2(sqrt(nlist))``, at least
    16 and at most ``nlist`` (64 lists -> 16, 4096 -> 64, 16384 -> 128, 65536 -> 256). A query
    then scans about ``rows / sqrt(nlist)`` vectors, so the search cost grows with the gallery
    as N^(3/4). At 4096 lists, visiting 16 instead of 64 gave recall@10 0.92 for 0.9975
    (``sharded_ivf``, docs/scale.md)."""
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
    """How the ``sharded_ivf`` builder makes its HNSW quantizer (M, efSearch when adding), read
    when called: part of a sharded build's identity, so a build made with others is another
    folder."""
    return {"m": HNSW_M, "ef_add": HNSW_EF_ADD}


def ivf_quantizer(nlist: int, quantizer: str = "auto") -> str:
    """``"flat"`` or ``"hnsw"``: ``quantizer`` itself, or for ``"auto"`` HNSW from
    ``HNSW_MIN_NLIST`` lists on."""
    if quantizer not in QUANTIZERS:
        raise ValueError(f"quantizer must be one of {QUANTIZERS}, got {quantizer!r}")
    if quantizer == "auto":
        return "hnsw" if nlist >= HNSW_MIN_NLIST else "flat"
    return quantizer


def quantizer_ef(index: faiss.Index) -> int | None:
    """The ``efSearch`` of ``index``'s HNSW coarse quantizer; None for any other index."""
    try:
        coarse = faiss.downcast_index(faiss.extract_index_ivf(index).quantizer)
    except RuntimeError:  # not an IVF (flat), or a GPU index
        return None
    return int(coarse.hnsw.efSearch) if isinstance(coarse, faiss.IndexHNSW) else None
