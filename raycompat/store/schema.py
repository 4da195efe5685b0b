"""The table a version holds: its columns, how to build one, and the checks every table passes on
publish and on read. Each error names the source (file or table) and the row.

Columns: ``id`` (string or int64, unique, non-null), ``embedding`` (``fixed_size_list<float32>``
or ``<float16>`` of the model's width), optional ``side_info`` (``fixed_size_list<float32>``),
optional ``label`` (int64), and in a partial backfill's version
(``raycompat.cluster.pipelines.backfill``) ``provenance`` (string, one of
:data:`PROVENANCE_VALUES`) and optional ``uncertainty`` (float32, the sigma of h). Schema
metadata (``raycompat.*`` keys) records the version, model version, width, normalisation and
lineage, so a part file read on its own still says what it holds.

- Build: :func:`embedding_schema`, :func:`embedding_table`, :func:`cast_embeddings` (to the
  version's stored dtype), :func:`version_metadata`.
- Check: :func:`validate_schema` looks at column names, types, widths and the metadata (cheap,
  from a Parquet footer); :func:`validate_values` at the rows: null ids, null/NaN/inf vectors,
  rows that are not unit-norm in a ``normalized`` version, duplicate ids
  (:func:`check_unique_ids`, also across the parts of a version), provenance values outside
  :data:`PROVENANCE_VALUES` and null/NaN/inf ``uncertainty``. Staging runs both on every part it
  writes and at commit (``commit/``), ``GalleryStore`` on every read, adoption on every file it
  pins.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raycompat.errors import DuplicateIdError, SchemaError
from raycompat.store.manifest import VersionInfo
from raycompat.store.read.vectors import float32_rows

ID_TYPES = {"string": pa.string(), "int64": pa.int64()}
_ACCEPTED_ID_TYPES = (*ID_TYPES.values(), pa.large_string())  # Arrow reads may give large_string
ARROW_DTYPES = {"float32": pa.float32(), "float16": pa.float16()}
NORM_TOLERANCE = {"float32": 1e-3, "float16": 4e-3}  # float16 rounds each coordinate to ~5e-4
# A partial backfill's columns: where each row came from, h(old) ("transformed") or re-extracted
# by the new model ("extracted"), and h's sigma for it (FastFill)
PROVENANCE_VALUES = ("transformed", "extracted")
PROVENANCE_FIELD = pa.field("provenance", pa.string(), nullable=False)
UNCERTAINTY_FIELD = pa.field("uncertainty", pa.float32(), nullable=False)


def version_metadata(info: VersionInfo) -> dict[str, str]:
    """``raycompat.<field>`` -> string value for the fields that describe a version's rows."""
    return info.schema_metadata()


def embedding_schema(
    width: int,
    id_type: str = "string",
    side_info_width: int | None = None,
    with_label: bool = False,
    metadata: dict | None = None,
    dtype: str = "float32",
) -> pa.Schema:
    """Schema of a version's tables; ``metadata`` (str -> str) is attached as schema metadata.
    ``dtype`` is the stored type of ``embedding`` (``"float32"`` or ``"float16"``)."""
    if dtype not in ARROW_DTYPES:
        raise SchemaError(f"dtype must be one of {sorted(ARROW_DTYPES)}, got {dtype!r}")
    if id_type not in ID_TYPES:
        raise SchemaError(f"id_type must be one of {sorted(ID_TYPES)}, got {id_type!r}")
    fields = [
        pa.field("id", ID_TYPES[id_type], nullable=False),
        pa.field("embedding", pa.list_(ARROW_DTYPES[dtype], width), nullable=False),
    ]
    if side_info_width is not None:
        fields.append(pa.field("side_info", pa.list_(pa.float32(), side_info_width)))
    if with_label:
        fields.append(pa.field("label", pa.int64()))
    return pa.schema(fields, metadata=metadata)


def embedding_table(
    ids: Any,
    embeddings: Any,
    side_info: Any = None,
    labels: Any = None,
    info: VersionInfo | None = None,
) -> pa.Table:
    """A table from ``ids (N,)``, ``embeddings (N, d)``, ``side_info (N, s)``, ``labels (N,)``.

    With ``info``, the version metadata is attached (``Staging.write_table`` does this too).
    """
    ids = pa.array(ids)
    columns = {"id": ids, "embedding": _fixed_size(embeddings, "embeddings")}
    if side_info is not None:
        columns["side_info"] = _fixed_size(side_info, "side_info")
    if labels is not None:
        columns["label"] = pa.array(np.asarray(labels, dtype=np.int64))
    table = pa.table(columns)
    return table.replace_schema_metadata(version_metadata(info)) if info else table


def _fixed_size(x: Any, name: str) -> pa.FixedSizeListArray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise SchemaError(f"{name} must be a 2-D (N, d) matrix, got shape {x.shape}")
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


def cast_embeddings(table: pa.Table, info: VersionInfo) -> pa.Table:
    """``table`` with its ``embedding`` column in the version's stored dtype (float32 rows
    written into a float16 version are rounded here; values beyond float16's range become
    inf, which validation then refuses, naming the row)."""
    if "embedding" not in table.column_names:
        return table
    field = table.schema.field("embedding")
    want = ARROW_DTYPES[info.dtype]
    if not pa.types.is_fixed_size_list(field.type) or field.type.value_type == want:
        return table
    typed = pa.list_(want, field.type.list_size)
    index = table.schema.get_field_index("embedding")
    column = table.column("embedding").cast(typed)
    return table.set_column(index, field.with_type(typed), column)


def _vector_type_error(field: pa.Field, width: int | None, dtype: str = "float32") -> str | None:
    t = field.type
    ok = pa.types.is_fixed_size_list(t) and t.value_type == ARROW_DTYPES[dtype]
    if ok and (width is None or t.list_size == width):
        return None
    want = f"fixed_size_list<{dtype}>[{width if width is not None else 'd'}]"
    return f"column {field.name!r} has type {t}, expected {want}"


def validate_schema(schema: pa.Schema, info_or_width: VersionInfo | int, source: str) -> None:
    """Column names, types and widths, and (if present) the ``raycompat.*`` metadata."""
    info = info_or_width if isinstance(info_or_width, VersionInfo) else None
    width = info.width if info else int(info_or_width)
    missing = [c for c in ("id", "embedding") if c not in schema.names]
    if missing:
        raise SchemaError(f"{source}: missing column(s) {missing}; columns are {schema.names}")
    problems = []
    if schema.field("id").type not in _ACCEPTED_ID_TYPES:
        problems.append(f"column 'id' has type {schema.field('id').type}, expected string/int64")
    problems.append(_vector_type_error(schema.field("embedding"), width, _dtype(info)))
    if "side_info" in schema.names:
        if info and info.side_info_width is None:
            problems.append("column 'side_info' present but the version declares no side info")
        else:
            side_width = info.side_info_width if info else None
            problems.append(_vector_type_error(schema.field("side_info"), side_width))
    elif info and info.side_info_width is not None:
        problems.append(f"missing column 'side_info' (width {info.side_info_width})")
    if "label" in schema.names and schema.field("label").type != pa.int64():
        problems.append(f"column 'label' has type {schema.field('label').type}, expected int64")
    if "provenance" in schema.names and not _is_string(schema.field("provenance").type):
        problems.append(
            f"column 'provenance' has type {schema.field('provenance').type}, expected string"
        )
    if "uncertainty" in schema.names and schema.field("uncertainty").type != UNCERTAINTY_FIELD.type:
        problems.append(
            f"column 'uncertainty' has type {schema.field('uncertainty').type}, expected float"
        )
    if info and schema.metadata:
        expected = info.schema_metadata()
        for key, value in schema.metadata.items():
            k, v = key.decode(errors="replace"), value.decode(errors="replace")
            if k in expected and expected[k] != v:
                problems.append(f"metadata {k}={v!r} but the version says {expected[k]!r}")
    problems = [p for p in problems if p]
    if problems:
        raise SchemaError(f"{source}: " + "; ".join(problems))


def validate_values(
    table: pa.Table | pa.RecordBatch,
    info_or_width: VersionInfo | int,
    source: str,
    row_offset: int = 0,
) -> None:
    """Null ids, null/NaN/inf vectors, unnormalised rows (if ``normalized``), duplicate ids.

    ``row_offset`` is added to row numbers in messages (position of ``table`` in its file).
    """
    info = info_or_width if isinstance(info_or_width, VersionInfo) else None
    if "id" in table.column_names:
        ids = _combined(table.column("id"))
        if ids.null_count:
            row = row_offset + pc.index(pc.is_null(ids), True).as_py()
            raise SchemaError(f"{source}: row {row} has a null id")
        check_unique_ids([(source, ids)], row_offset)
    for name in ("embedding", "side_info"):
        if name in table.column_names:
            _check_vectors(
                _combined(table.column(name)),
                name,
                source,
                row_offset,
                normalized=bool(info and info.normalized and name == "embedding"),
                tolerance=NORM_TOLERANCE[_dtype(info) if name == "embedding" else "float32"],
            )
    if "provenance" in table.column_names:
        _check_provenance(_combined(table.column("provenance")), source, row_offset)
    if "uncertainty" in table.column_names:
        _check_uncertainty(_combined(table.column("uncertainty")), source, row_offset)


def validate_table(table: pa.Table, info_or_width: VersionInfo | int, source: str) -> None:
    """Schema and value checks together; every error names ``source`` and the row."""
    validate_schema(table.schema, info_or_width, source)
    validate_values(table, info_or_width, source)


def _dtype(info: VersionInfo | None) -> str:
    return info.dtype if info else "float32"


def _combined(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _check_vectors(
    arr: pa.Array, name: str, source: str, offset: int, normalized: bool, tolerance: float
) -> None:
    if arr.null_count:
        row = offset + pc.index(pc.is_null(arr), True).as_py()
        raise SchemaError(f"{source}: row {row} has a null {name}")
    x = float32_rows(arr, copy=False)  # float16 widened exactly (read/vectors.py)
    if not all_finite(x):
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
        raise SchemaError(
            f"{source}: {bad.size} row(s) of {name} hold NaN/inf; first is row {offset + bad[0]}"
        )
    if normalized:
        # |norm - 1| <= tol  <=>  (1 - tol)^2 <= norm^2 <= (1 + tol)^2; einsum makes no (N, d)
        # temporary, unlike np.linalg.norm's x * x.
        squared = np.einsum("ij,ij->i", x, x)
        off = np.flatnonzero((squared < (1 - tolerance) ** 2) | (squared > (1 + tolerance) ** 2))
        if off.size:
            raise SchemaError(
                f"{source}: the version is normalized but {off.size} row(s) of {name} are not "
                f"unit-norm; first is row {offset + off[0]} (norm {np.sqrt(squared[off[0]]):.6g})"
            )


def all_finite(x: np.ndarray) -> bool:
    """No NaN or inf in ``x``: two SIMD reductions and no temporary. ``min``/``max`` propagate
    NaN and return any inf, so this is exact; the row-wise ``isfinite`` pass (an ``x``-sized
    boolean array) runs only to name the bad rows of a table that fails."""
    return x.size == 0 or bool(np.isfinite(x.min()) and np.isfinite(x.max()))


def _is_string(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _check_provenance(arr: pa.Array, source: str, offset: int) -> None:
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    bad = pc.invert(pc.is_in(arr, value_set=pa.array(PROVENANCE_VALUES, arr.type)))
    bad = pc.fill_null(bad, True)  # a null provenance is as wrong as an unknown one
    if pc.any(bad).as_py():
        row = pc.index(bad, True).as_py()
        raise SchemaError(
            f"{source}: row {offset + row} has provenance {arr[row].as_py()!r}; "
            f"expected one of {list(PROVENANCE_VALUES)}"
        )


def _check_uncertainty(arr: pa.Array, source: str, offset: int) -> None:
    if arr.null_count:
        row = offset + pc.index(pc.is_null(arr), True).as_py()
        raise SchemaError(f"{source}: row {row} has a null uncertainty")
    bad = np.flatnonzero(~np.isfinite(arr.to_numpy(zero_copy_only=False)))
    if bad.size:
        raise SchemaError(
            f"{source}: {bad.size} row(s) of uncertainty are NaN/inf; first is row "
            f"{offset + bad[0]}"
        )


def check_unique_ids(parts: list[tuple[str, pa.Array]], row_offset: int = 0) -> None:
    """Raise :class:`DuplicateIdError` naming the first repeated id, its files and rows.

    Args:
        parts: ``(source, ids)`` per part file, in order; rows are counted within each part.
    """
    if _increasing_int_ids(parts):
        return
    arrays = [a.cast(pa.large_string()) if pa.types.is_string(a.type) else a for _, a in parts]
    every = pa.chunked_array(arrays) if arrays else pa.chunked_array([], pa.int64())
    if pc.count_distinct(every).as_py() == len(every):
        return
    counts = pc.value_counts(every)
    dup = counts.field("values")[pc.index(pc.greater(counts.field("counts"), 1), True).as_py()]
    where = [
        f"{source} row {row_offset + int(r)}"
        for (source, _), a in zip(parts, arrays, strict=True)
        for r in pc.indices_nonzero(pc.equal(a, dup)).to_numpy()
    ]
    raise DuplicateIdError(f"duplicate id {dup.as_py()!r} at {', '.join(where)}")


def _increasing_int_ids(parts: list[tuple[str, pa.Array]]) -> bool:
    """True when the int64 ids of ``parts``, in order, strictly increase (so are unique): the
    common case of a gallery written in id order, checked with one vectorised comparison instead
    of a hash table (``count_distinct``). False means "not shown", not "duplicates"."""
    arrays = [a for _, a in parts]
    if not arrays or any(
        not isinstance(a, pa.Array) or a.type != pa.int64() or a.null_count for a in arrays
    ):
        return False
    # Zero-copy views of the data buffers (Array.to_numpy would import pandas on a CLI read).
    views = [np.frombuffer(a.buffers()[1], "<i8", len(a), a.offset * 8) for a in arrays]
    ids = views[0] if len(views) == 1 else np.concatenate(views)
    return bool(np.all(ids[1:] > ids[:-1]))
