"""Work units (chunks) and their output part files: planned from footers, written atomically.

A :class:`Chunk` is a run of whole row groups of one input file (or a row range of an image
dataset) that becomes exactly one output part with a deterministic part name (its file gets a
name unique to the writer, ``part_record.part_file_name``). The part is
streamed batch by batch into ``_tmp/`` under the staging prefix and moved into place when
complete (the store's own protocol, ``Staging.publish_part``), so a part name never holds a
partial file, and memory stays at one batch whatever ``rows_per_file`` is.
This module does not import Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from raycompat.store import Staging, validate_table, version_metadata
from raycompat.store.commit.part_record import IdFingerprint, IdStats, PartRecord
from raycompat.store.read.parquet import dictionary_columns


@dataclass
class Chunk:
    """One unit of work -> one output part file.

    Attributes:
        part: output part file name, e.g. ``"part-00003-0001.parquet"`` (input 3, chunk 1).
        input: index of the input (a source file, or 0 for a dataset).
        path: filesystem path of the input file ("" for a dataset source).
        row_groups: the input's row groups this chunk reads (empty for a dataset source).
        start, stop: row range ``[start, stop)`` in the input (for messages and datasets).
    """

    part: str
    input: int
    path: str
    start: int
    stop: int
    row_groups: list[int] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.stop - self.start


def plan_file_chunks(
    index: int, path: str, metadata: pq.FileMetaData, rows_per_file: int
) -> list[Chunk]:
    """Group the row groups of one Parquet input into chunks of about ``rows_per_file`` rows.

    A chunk closes once it holds ``rows_per_file`` rows or more, so chunks never split a row
    group (output files are at most ``rows_per_file`` + one input row group long).
    """
    chunks, groups, start, rows = [], [], 0, 0
    for g in range(metadata.num_row_groups):
        groups.append(g)
        rows += metadata.row_group(g).num_rows
        if rows >= rows_per_file or g == metadata.num_row_groups - 1:
            name = f"part-{index:05d}-{len(chunks):04d}.parquet"
            chunks.append(Chunk(name, index, path, start, start + rows, groups))
            groups, start, rows = [], start + rows, 0
    return chunks


def plan_range_chunks(total_rows: int, rows_per_file: int) -> list[Chunk]:
    """Row ranges ``[k * rows_per_file, ...)`` of one dataset input."""
    return [
        Chunk(f"part-00000-{k:04d}.parquet", 0, "", s, min(s + rows_per_file, total_rows))
        for k, s in enumerate(range(0, total_rows, rows_per_file))
    ]


class PartWriter:
    """Stream validated tables into one part file; it appears under its name only on ``close``.

    Every table is checked with ``validate_table`` against the version (schema, widths,
    NaN/inf, norms, ids unique within the table); errors name the part and row. The file is
    written under a per-attempt temporary name, hashed as it is written, and published by
    ``Staging.publish_part``, which checks the lease and creates the part record (rows, bytes,
    sha256, id fingerprint) first, under the file's writer-unique name.
    """

    def __init__(self, staging: Staging, name: str, schema: pa.Schema) -> None:
        self.staging, self.name = staging, name
        self.source = f"{staging.uri}/{name}"
        meta = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
        meta.update(version_metadata(staging.info))
        self.schema = schema.with_metadata(meta)
        self.rows, self.ids = 0, IdStats()
        self.input_ids: IdFingerprint | None = None  # set by workers that map rows 1:1
        self.extra: dict = {}  # per-part counts a pipeline keeps in the part record
        self._tmp, self._sink = staging.open_part(name)
        self._writer = pq.ParquetWriter(
            self._sink,
            self.schema,
            write_page_checksum=True,
            use_dictionary=dictionary_columns(self.schema),
        )

    def write(self, table: pa.Table) -> None:
        table = table.select(self.schema.names).cast(self.schema)
        validate_table(table, self.staging.info, f"{self.source} (rows from {self.rows})")
        self._writer.write_table(table)
        self.ids.update(table.column("id"))
        self.rows += table.num_rows

    def read(self, ids: pa.Array | pa.ChunkedArray) -> None:
        """Count input ids that this part maps 1:1 to output rows (its record's ``input_ids``,
        which lets commit check the part without reading it)."""
        self.input_ids = (self.input_ids or IdFingerprint()).update(ids)

    def close(self) -> PartRecord:
        """Finish the file and publish it as the part (lease checked); returns its record."""
        self._writer.close()
        self._sink.close()
        return self.staging.publish_part(
            self._tmp, self.name, self.ids, self.rows, self._sink, self.input_ids, self.extra
        )

    def abort(self) -> None:
        """Drop the temporary file (called on any error; the part name stays absent)."""
        try:
            self._writer.close()
            self._sink.close()
        finally:
            self.staging.drop_tmp(self._tmp)
