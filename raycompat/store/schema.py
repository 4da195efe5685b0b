"""Arrow schema of a store version, and the checks every table passes on publish and on read.

Columns: ``id`` (string or int64, unique, non-null), ``embedding`` (``fixed_size_list<float32>``
of the model's width), optional ``side_info`` (``fixed_size_list<float32>``), optional ``label``
(int64), and in a partial backfill's version (``raycompat.cluster.pipelines.backfill``)
``provenance``
(string, ``"transformed"`` or ``"extracted"``) and optional ``uncertainty`` (float32, the sigma of
h). Schema metadata (``raycompat.*`` keys) records the version, model version, width,
normalisation and lineage, so a part file read on its own still says what it holds. The checks
live in :mod:`raycompat.store.validate`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from raycompat.errors import SchemaError
from raycompat.store.manifest import VersionInfo
from raycompat.store.validate import ARROW_DTYPES

ID_TYPES = {"string": pa.string(), "int64": pa.int64()}
# A partial backfill's columns: where each row came from, and h's sigma for it (FastFill)
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
