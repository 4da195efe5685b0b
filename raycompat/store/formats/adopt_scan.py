"""Validating one file of a table being adopted (``adopt.py``): a Ray task per file or group.

A scan streams the file a batch at a time (bounded memory) and checks what ``write_table``
checks: the id and embedding columns (names, types), the width of every row (variable lists
must all be as long as the file's first row), null ids, null vectors, NaN/inf, ids unique within
each batch. It returns a :class:`FileReport` (``adopt.py``) of constant size whatever the rows,
and the driver decides from the reports alone whether the ids need a distributed uniqueness
check (:func:`proven_unique`). Every error names the file and the row (and id). No Ray here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raycompat.errors import SchemaError, StoreError
from raycompat.store.commit.part_record import IdStats
from raycompat.store.formats.adopt import AdoptionPlan, FileReport
from raycompat.store.formats.external import (
    as_store_columns,
    is_list,
    renames,
    stat_file,
    store_schema,
)
from raycompat.store.manifest import VersionInfo
from raycompat.store.paths import join
from raycompat.store.read.parquet import iter_file_batches, open_parquet
from raycompat.store.schema import NORM_TOLERANCE, validate_schema, validate_values

if TYPE_CHECKING:
    from raycompat.store.gallery import GalleryStore

ID_TYPES = (pa.int64(), pa.string(), pa.large_string())
DTYPES = {pa.float32(): "float32", pa.float16(): "float16"}


def _check_columns(schema: pa.Schema, plan: AdoptionPlan, source: str) -> tuple[int | None, str]:
    """``(width or None for variable lists, dtype)`` of a file's id and embedding columns."""
    for column, store_name in ((plan.id_column, "id"), (plan.embedding_column, "embedding")):
        if column not in schema.names:
            raise SchemaError(
                f"{source}: no column {column!r} (the {store_name} column; columns are "
                f"{schema.names}; choose another with --{store_name}-column)"
            )
        if column != store_name and store_name in schema.names:
            raise SchemaError(
                f"{source}: column {store_name!r} exists beside {column!r}, which is read as "
                f"{store_name!r}"
            )
    id_type = schema.field(plan.id_column).type
    if id_type not in ID_TYPES:
        raise SchemaError(
            f"{source}: id column {plan.id_column!r} has type {id_type}; adopt takes int64 or "
            f"string ids"
        )
    vector = schema.field(plan.embedding_column).type
    if not is_list(vector) or vector.value_type not in DTYPES:
        raise SchemaError(
            f"{source}: embedding column {plan.embedding_column!r} has type {vector}; adopt "
            f"takes lists (fixed-size or not) of float32 or float16"
        )
    width = vector.list_size if pa.types.is_fixed_size_list(vector) else None
    return width, DTYPES[vector.value_type]


def _row_widths(batch: pa.RecordBatch, plan: AdoptionPlan, width: int | None, source, offset):
    """The file's width (its first row's), checking every row of a variable-list batch."""
    column = batch.column(plan.embedding_column)
    if pa.types.is_fixed_size_list(column.type):
        return width
    lengths = pc.list_value_length(column)
    if width is None:
        if lengths.null_count == len(lengths):
            raise SchemaError(f"{source}: row {offset} has a null embedding")
        width = lengths.drop_null()[0].as_py()
    wrong = pc.fill_null(pc.not_equal(lengths, width), False)
    if pc.any(wrong).as_py():
        row = pc.index(wrong, True).as_py()
        raise SchemaError(
            f"{source}: row {offset + row} (id {batch.column(plan.id_column)[row].as_py()!r}) "
            f"has {lengths[row].as_py()} values in {plan.embedding_column!r}, but the file's "
            f"first row has {width}"
        )
    return width


def scan_file(store: GalleryStore, plan: AdoptionPlan, rel: str, batch_size: int = 65536):
    """Validate one file, streaming it: schema, widths, null ids and vectors, NaN/inf, ids
    unique within each batch. Returns its :class:`FileReport`; errors name the file and row."""
    backend, path = store.backend, join(plan.root, rel)
    source = backend.uri(path)
    try:
        before = stat_file(backend, path)
    except FileNotFoundError:
        raise StoreError(f"{source}: the file vanished while it was being adopted") from None
    names = renames(plan.external())
    with open_parquet(backend.filesystem, path, source) as parquet:
        width, dtype = _check_columns(parquet.schema_arrow, plan, source)
        probe = VersionInfo("adopt", plan.model, width or 1, False, "adopt", dtype=dtype)
        mapped = store_schema(parquet.schema_arrow, names, width or 1)
        validate_schema(mapped, probe, source)
        stats, rows, not_unit, ascending, last = IdStats(), 0, None, True, None
        for batch, offset in iter_file_batches(parquet, source, batch_size):
            if not batch.num_rows:
                continue
            width = _row_widths(batch, plan, width, source, offset)
            batch = as_store_columns(batch, names, width)
            validate_values(batch, width, source, offset)
            stats.update(batch.column("id"))
            ascending, last = _ascending(batch.column("id"), ascending, last)
            if not_unit is None:
                not_unit = _first_not_unit(batch, width, dtype, offset)
            rows += batch.num_rows
    if stat_file(backend, path) != before:
        raise StoreError(f"{source}: the file changed while it was being adopted")
    return FileReport(
        rel,
        before["bytes"],
        rows,
        before["etag"],
        before["mtime_ns"],
        stats.fingerprint,
        stats.min_id,
        stats.max_id,
        width,
        dtype,
        [f"{f.name}: {f.type}" for f in mapped if f.name != "embedding"],
        not_unit,
        ascending,
    )


def _ascending(ids: pa.Array, ascending: bool, last) -> tuple[bool, object]:
    """Whether ids are still strictly increasing after this batch, and its last id."""
    if not ascending or not len(ids):
        return ascending, last
    inside = len(ids) < 2 or pc.all(pc.greater(ids[1:], ids[:-1])).as_py()
    first = ids[0].as_py()
    return bool(inside) and (last is None or last < first), ids[-1].as_py()


def proven_unique(reports: list[FileReport]) -> bool:
    """True when the reports alone prove every id unique: each file's ids strictly increase
    and the files' id ranges do not overlap (common for exported tables; no shuffle needed).
    Otherwise the ids must be grouped (``cluster/pipelines/unique.py``)."""
    spans = sorted((r.min_id, r.max_id, r.ascending) for r in reports if r.rows)
    if not all(ascending for _, _, ascending in spans):
        return False
    return all(spans[k][1] < spans[k + 1][0] for k in range(len(spans) - 1))


def _first_not_unit(batch: pa.RecordBatch, width: int, dtype: str, offset: int) -> int | None:
    x = batch.column("embedding").flatten().to_numpy(zero_copy_only=False)
    norms = np.linalg.norm(x.astype(np.float32).reshape(-1, width), axis=1)
    off = np.flatnonzero(np.abs(norms - 1.0) > NORM_TOLERANCE[dtype])
    return offset + int(off[0]) if off.size else None
