"""Reading a stored version as pipeline input: plan chunks from footers, stream validated rows.

Planning reads only Parquet footers (cheap, on the driver), so a corrupt or truncated input
file, a file missing a column, or a file of another version fails before any Ray work. Rows are
validated as they stream (in the actors): NaN/inf or null vectors raise a ``SchemaError`` naming
the input file and the row in it. No Ray here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from raycompat.cluster.pipelines.parts import Chunk, plan_file_chunks
from raycompat.store import GalleryStore, ManifestError, VersionInfo
from raycompat.store.read.parquet import iter_file_batches
from raycompat.store.schema import validate_schema, validate_values

VECTOR_COLUMNS = ("id", "embedding", "side_info")


def plan_version_chunks(
    store: GalleryStore, gallery: str, info: VersionInfo, rows_per_file: int
) -> tuple[list[Chunk], str, list[pa.Field]]:
    """``(chunks, id type "string"|"int64", carried fields)`` of a published version.

    Carried fields are the columns besides ``id``/``embedding``/``side_info`` (e.g. ``label``),
    copied unchanged into the output.
    """
    chunks, rows, first = [], 0, None
    for index, (path, source) in enumerate(store.version_files(gallery, info)):
        with store.open_file(info, path, source) as parquet:
            schema = parquet.schema_arrow
            validate_schema(schema, info, source)
            first = first or schema
            chunks += plan_file_chunks(index, path, parquet.metadata, rows_per_file)
            rows += parquet.metadata.num_rows
    if rows != info.rows:
        raise ManifestError(
            f"{store.uri(gallery)}: version {info.version} record says "
            f"{info.rows} rows, its files hold {rows}"
        )
    id_type = "int64" if pa.types.is_integer(first.field("id").type) else "string"
    carried = [f for f in first if f.name not in VECTOR_COLUMNS]
    return chunks, id_type, carried


def iter_chunk_batches(
    store: GalleryStore,
    chunk: Chunk,
    info: VersionInfo,
    batch_size: int,
    columns: list[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Validated batches of one chunk (its row groups of its input file), bounded memory;
    ``columns`` reads only those (default: all)."""
    source = store.backend.uri(chunk.path)
    with store.open_file(info, chunk.path, source) as parquet:
        batches = iter_file_batches(
            parquet, source, batch_size, columns, row_groups=chunk.row_groups, start=chunk.start
        )
        for batch, offset in batches:
            validate_values(batch, info, source, offset)
            yield batch


def file_digest(path: str | Path, block: int = 1 << 22) -> str:
    """SHA-256 of a file (identifies the model a staging prefix was written with)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while data := handle.read(block):
            digest.update(data)
    return digest.hexdigest()
