"""How well a version's index answers: recall@k against exact search, on sampled stored rows.

    index = load_version_index(store, "faces", "v3", verify="full")
    estimate_recall(store, "faces", index, queries=200)   # {"recall": 0.998, "queries": 200, ...}

``queries`` rows of the version, sampled with ``seed``, are the queries. The exact answer is
streamed: each batch of the version gets an exact ``flat`` index of its own, the queries' top-k
of every batch are merged, so memory is ``O(batch x d + queries x k)`` whatever the version's
size. recall@k is the mean over queries of ``|index top-k ∩ exact top-k| / k`` (by gallery
id; ``k`` is capped at the version's rows), the measure of docs/scale.md's recall target.
Ties between equal scores may be broken differently by the two searches, so a version holding
duplicate rows can score below 1.0 even with an exact index.
"""

from __future__ import annotations

import faiss
import numpy as np

from raycompat.index.search_index import SearchIndex
from raycompat.index.sharded import sample_rows
from raycompat.index.version_index import VersionIndex, _id_array, rows_at
from raycompat.store.gallery import GalleryStore
from raycompat.store.read.vectors import vectors


def exact_top_k(
    store: GalleryStore,
    gallery: str,
    index: VersionIndex,
    queries: np.ndarray,
    k: int,
    batch_size: int = 65536,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``scores (Q, k)`` and gallery ``ids (Q, k)``, best first, with the distance of
    ``index``, streamed over the version batch by batch."""
    info, dist = index.info, index.index.distance
    best_scores = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_ids = np.empty((len(queries), 0), dtype=index.ids.dtype)
    for batch in store.iter_batches(gallery, info.version, batch_size, ["id", "embedding"]):
        x = vectors(batch, "embedding").reshape(-1, info.width)
        flat = SearchIndex(faiss.IndexFlat(info.width, dist.faiss_metric), dist, "flat")
        flat.index.add(np.ascontiguousarray(dist.prepare_numpy(x, "gallery"), np.float32))
        scores, rows = flat.search(queries, min(k, batch.num_rows))
        ids = _id_array(batch.column("id"))[rows]
        scores = np.concatenate([best_scores, scores], axis=1)
        merged = np.concatenate([best_ids, ids], axis=1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(scores, order, axis=1)
        best_ids = np.take_along_axis(merged, order, axis=1)
    return best_scores, best_ids


def estimate_recall(
    store: GalleryStore,
    gallery: str,
    index: VersionIndex,
    *,
    queries: int = 100,
    k: int = 10,
    seed: int = 0,
    nprobe: int | None = None,
    batch_size: int = 65536,
) -> dict:
    """recall@k of ``index`` against exact search, on ``queries`` sampled stored rows.

    Returns:
        ``{"recall": float in [0, 1], "queries": Q, "k": k}`` (``k`` capped at the rows).
    """
    info = index.info
    k = min(k, info.rows)
    rows = sample_rows(info.rows, min(queries, info.rows), seed)
    q = np.ascontiguousarray(rows_at(store, gallery, info, rows, batch_size), np.float32)
    _, found = index.search(q, k, nprobe=nprobe)
    _, exact = exact_top_k(store, gallery, index, q, k, batch_size)
    hits = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(found, exact, strict=True)]
    return {"recall": float(np.mean(hits)) / k, "queries": len(rows), "k": k}
