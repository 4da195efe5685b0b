"""Rows of a version found by id: queries given as stored ids, the pairs an adapter is fitted on.

- :func:`stored_rows`: the rows holding some ids, in one streamed scan that keeps only the
  matches (memory grows with the ids asked, not with the version).
- :func:`stored_vectors`: the embeddings of ids given as text (``search --ids``), in query order.
- :func:`embeddings_of`: the embeddings of typed ids, or the ids no row holds; the Ray layer
  passes its own ``rows_of`` (``cluster/pipelines/pairs.py``: tasks over the version's chunks).

Reads the store and never writes it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from raycompat.errors import StoreError
from raycompat.store import GalleryStore


def stored_rows(store: GalleryStore, gallery: str, version: str, ids: list, columns: list):
    """``(id -> row, table)`` of the rows of ``ids`` in the version (one streamed scan; only
    the matches are kept)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    found, want = [], None
    for batch in store.iter_batches(gallery, version, columns=["id", *columns]):
        want = want if want is not None else pa.array(ids).cast(batch.schema.field("id").type)
        found.append(batch.filter(pc.is_in(batch.column("id"), value_set=want)))
    table = pa.Table.from_batches(found) if found else pa.table({})
    return {i: k for k, i in enumerate(table.column("id").to_pylist())}, table


def stored_vectors(store: GalleryStore, gallery: str, version: str, ids: list[str]) -> np.ndarray:
    """``(Q, d)`` stored embeddings of ``ids`` in query order (given as text; int64 ids are
    parsed).

    Raises:
        StoreError: an id is not an int of an int64-id version, or no row holds it.
    """
    import pyarrow as pa

    first = next(store.iter_batches(gallery, version, batch_size=1, columns=["id"]))
    ids = typed_ids(ids, pa.types.is_int64(first.schema.field("id").type), f"{gallery}/{version}")
    found, missing = embeddings_of(store, gallery, version, ids)
    if missing:
        raise no_rows(f"{gallery}/{version}", missing)
    return found


def typed_ids(ids: list[str], int64: bool, where: str) -> list:
    """``ids`` given as text, parsed as ints where the version ``where`` has int64 ids."""
    if not int64:
        return ids
    try:
        return [int(i) for i in ids]
    except ValueError:
        raise StoreError(f"{where} has int64 ids; got {ids}") from None


def no_rows(where: str, missing: list) -> StoreError:
    return StoreError(f"{where} holds no row with id(s) {missing}")


def embeddings_of(
    store: GalleryStore, gallery: str, version: str, ids: list, rows_of: Callable | None = None
) -> tuple[np.ndarray | None, list]:
    """``(embeddings (len(ids), d) in ``ids`` order, [])`` of the rows holding ``ids`` (ids of
    the version's id type), or ``(None, the ids no row holds)``. ``rows_of`` finds them, as
    :func:`stored_rows` (the default: one streamed scan in this process) or the Ray layer's
    ``stored_matches`` (tasks over the version's chunks)."""
    from raycompat.store.read.vectors import vectors  # the core's: pipelines would import Ray

    where, table = (rows_of or stored_rows)(store, gallery, version, ids, ["embedding"])
    missing = [i for i in ids if i not in where]
    if missing:
        return None, missing
    return vectors(table, "embedding")[[where[i] for i in ids]], []
