"""Fit a query-side adapter from a file of the new model's embeddings of stored items.

    grant = adapt_queries(store, "faces", "v1", "m2", "m2_sample.parquet", kind="procrustes")

The file holds ``id`` and ``embedding`` columns: the new model's embeddings of items the
version stores (re-extract a sample of the gallery with the new model). Each row is paired
with the version's stored embedding of the same id (one streamed scan of the version, keeping
only the matches: memory grows with the pairs, not with the gallery; on Ray, one task per
chunk of the version, ``raycompat adapt --runner ray``), the map from the model's
space into the version's is fitted (``raycompat.transformations.fit``) and stored with a grant
(``serving/query_adapters.py``); from then on ``search`` maps the model's queries through it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from raycompat.errors import UsageError
from raycompat.serving.stored_rows import embeddings_of
from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog, QueryGrant
from raycompat.store.read.lookup import model_record, version_record
from raycompat.transformations.kinds import FITTED_KINDS


class PairsFileError(UsageError, ValueError):
    """The pairs file is unreadable, malformed, or names ids the version does not hold: one
    line naming the file (and the row or id), exit 2, nothing written."""


def read_pairs(path: str, width: int) -> tuple[list, np.ndarray]:
    """``(ids, (N, width) float32)`` from a Parquet file of ``id`` and ``embedding``."""
    import pyarrow.parquet as pq

    from raycompat.serving.query_inputs import query_problem
    from raycompat.store.read.vectors import vectors

    try:
        table = pq.read_table(path, columns=["id", "embedding"])
        x = vectors(table, "embedding")
    except (OSError, KeyError, ValueError, TypeError, AttributeError) as error:
        raise PairsFileError(
            f"{path}: not a Parquet file of id and a fixed-size list embedding ({error})"
        ) from None
    problem = query_problem(x, width)
    if problem:
        raise PairsFileError(f"{path}: expected finite (N, {width}) embeddings, got {problem}")
    return table.column("id").to_pylist(), x


def adapt_queries(
    store: GalleryStore,
    gallery: str,
    version: str,
    model: str,
    pairs: str,
    *,
    kind: str = "procrustes",
    lam: float = 0.0,
    rows_of: Callable | None = None,
) -> QueryGrant:
    """Fit ``kind`` on the pairs of ``pairs`` and grant ``model`` ``version`` through it.
    ``rows_of`` finds the version's rows of the pairs' ids (:func:`embeddings_of`: one scan
    in this process by default, or Ray tasks over its chunks).

    Raises:
        PairsFileError: the file is bad, or an id is not in the version.
        NotInStoreError, AdapterWidthError, StoreError: as
            :func:`~raycompat.serving.query_adapters.publish_adapter`.
    """
    from raycompat.serving.query_adapters import publish_adapter
    from raycompat.transformations import fit_kind

    if kind not in FITTED_KINDS:
        raise UsageError(f"--kind {kind!r}: one of {', '.join(FITTED_KINDS)}")
    version_record(store, gallery, version)
    ids, x = read_pairs(pairs, model_record(Catalog(store), model).embed_dim)
    if len(set(ids)) != len(ids):
        raise PairsFileError(f"{pairs}: an id appears twice")
    y, missing = embeddings_of(store, gallery, version, ids, rows_of)
    if missing:
        raise PairsFileError(
            f"{pairs}: {len(missing)} of {len(ids)} ids are not in {gallery}/{version} "
            f"(first: {missing[0]!r})"
        )
    fit = fit_kind(kind, x, y, lam=lam, where=pairs)
    return publish_adapter(store, gallery, version, model, fit)
