"""Search a gallery as a model: the one-shot query path that ``raycompat search``, the Python
API and the service share.

- :func:`search`: all of it in one call: the version ``model`` serves (``resolve.py``), its
  queries (``query_inputs.py``: a file, an array, stored ids or images, in the version's
  space), the search; its answer names the version, the index that answered and what the
  scores are (cosine similarity or negative squared L2).
- :func:`search_gallery`: the top-k of each query in the version's published index (without a
  valid one, an exact in-memory search of a small version; ``index/version_index.py``), ranked
  as every search ranks (``ranking.py``), as gallery ids with their stored labels
  (``labels.py``), and the notes a caller should show (why a query got fewer than ``k`` hits,
  why the search was exact).

A program that searches many times opens a gallery handle once instead
(``raycompat.open_gallery``: the index loaded once, the serving records followed). Everything
here reads the store and never writes it. No argparse and no Ray: a service that resolves
aliases itself calls :func:`search_gallery` with the version. torch and faiss load inside the
functions that use them, so the CLI starts without them (``tests/cli/test_startup.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raycompat.serving.labels import labels_of
from raycompat.serving.query_inputs import QueryError, check_k, query_vectors
from raycompat.serving.ranking import ranked_hits
from raycompat.serving.resolve import served_version
from raycompat.store import GalleryStore


@dataclass(frozen=True)
class QueryHits:
    """One query's hits, best first, only items found (``n <= k``).

    Attributes:
        ids: ``(n,)`` gallery ids (str or int64, as the version stores them).
        scores: ``(n,)`` similarity scores, higher is better.
        labels: the stored ``label`` of each id; None where the version has no label.
    """

    ids: np.ndarray
    scores: np.ndarray
    labels: list[Any]


@dataclass(frozen=True)
class SearchResult:
    """The hits of each query on ``gallery``/``version``, in query order; ``notes``: one-line
    notes a caller shows to the user (an exact search without an index, short hit lists).

    Attributes:
        index: what answered: ``build <id>`` (the published index build) or ``exact`` (an
            in-memory search of the version's rows, no index published).
        metric: what the scores are: ``cosine similarity``, ``negative squared L2`` or
            ``inner product`` (the index's distance, ``index/distances.py``).
        model: the query model, None for a version searched with its own vectors.
    """

    gallery: str
    version: str
    hits: list[QueryHits]
    notes: list[str]
    index: str = "exact"
    metric: str = ""
    model: str | None = None


def search(
    store: GalleryStore,
    gallery: str,
    model: str | None,
    *,
    vectors: np.ndarray | str | None = None,
    ids: Sequence[str] | None = None,
    images: Sequence[str] | None = None,
    k: int = 5,
    version: str | None = None,
    nprobe: int | None = None,
    names: Sequence[Any] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> SearchResult:
    """Search ``gallery`` as ``model``: the one query path of the CLI, the Python API and the
    service. The answer names the version searched, the index that answered and what its
    scores are (:class:`SearchResult`).

    Args:
        model: the query model; it serves the version searched unless ``version`` is given
            (then it may be None with ``vectors`` or ``ids``).
        vectors: ``(Q, d)`` queries of ``model`` (an array, or a ``.npy``/Parquet file);
            exactly one of ``vectors``, ``ids`` (rows stored in the version) and ``images``.
        k, nprobe, names, on_note: as :func:`search_gallery`.
    Raises:
        QueryError: not exactly one source, ``k < 1``, or malformed vectors (the row named).
        NotInStoreError, StoreError: as :func:`served_version`.
    """
    check_k(k)
    if version is None:
        if model is None:
            raise QueryError("search needs the query model or the gallery version")
        version = served_version(store, gallery, model).gallery_version
    queries = query_vectors(
        store, gallery, version, model, images=images, vectors=vectors, ids=ids, on_note=on_note
    )
    if names is None and isinstance(vectors, str):
        names = [f"{vectors}[{q}]" for q in range(len(queries))]
    return search_gallery(
        store, gallery, queries, k, model=model, version=version, nprobe=nprobe, names=names,
        on_note=on_note,
    )  # fmt: skip


def search_gallery(
    store: GalleryStore,
    gallery: str,
    queries: np.ndarray,
    k: int,
    *,
    model: str | None = None,
    version: str | None = None,
    nprobe: int | None = None,
    names: Sequence[Any] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> SearchResult:
    """The top-``k`` hits of each of ``queries (Q, d)`` in ``gallery``, read-only.

    Args:
        model: the query model; without ``version``, the version it serves is searched
            (:func:`served_version`). It also names the model in errors.
        version: the gallery version to search (a service that resolved an alias gives it).
        nprobe: inverted lists an IVF index visits per query; ignored by an exact index.
        names: what to call each query in errors (default its row number).
        on_note: called with each note as it arises, so a caller that prints them shows the
            first even when the search then fails; every note is also in the result.
    Raises:
        QueryError: ``k < 1``, queries not ``(Q, d)``, or neither ``model`` nor ``version``.
        ZeroNormError: a zero query on a cosine version (the message names the query).
        IndexNeededError: no valid index, and the version is too large to search exactly.
    """
    from raycompat.index.version_index import open_search_index

    check_k(k)
    if np.ndim(queries) != 2:
        raise QueryError(f"queries: expected shape (Q, d), got {np.shape(queries)}")
    if version is None:
        if model is None:
            raise QueryError("search_gallery needs the query model or the gallery version")
        version = served_version(store, gallery, model).gallery_version
    notes: list[str] = []

    def note(line: str) -> None:
        notes.append(line)
        if on_note is not None:
            on_note(line)

    index, exact = open_search_index(store, gallery, version)
    if exact:
        note(exact)
    names = list(range(len(queries))) if names is None else list(names)
    hits, short = ranked_hits(index, queries, k, nprobe, names, model)
    if short:
        note(short)
    labels = labels_of(store, gallery, version, [ids for _, ids in hits])
    found = [QueryHits(i, s, lrow) for (s, i), lrow in zip(hits, labels, strict=True)]
    metric = index.index.distance.score_label
    return SearchResult(gallery, version, found, notes, index.source, metric, model)
