"""Writing an exported version as a Delta Lake table: Parquet files written here, committed
through ``deltalake`` (delta-rs) as one table version.

The batches stream into Parquet files under the target (pyarrow's writer, a new file every
:data:`FILE_BYTES` of Arrow data, one row group per batch), each file's statistics taken as it
is written; the files are then committed as one Delta transaction (``deltalake.transaction``:
``create_table_with_add_actions`` for a new table, ``create_write_transaction`` overwriting an
existing one). Memory stays a few batches (the one written, two read ahead) and one file's
footer, whatever the row count: delta-rs's own ``write_deltalake``, given the same stream, held a
growing share of it (issue 54: 719-814 MB for the 2.4x10^7 rows a transform job wrote, against
330 MB here; 2.0 GB at 10^8, against 323 MB; docs/scale.md).
A second commit sets the table properties naming the source (``raycompat.source.*``,
``export.py``): delta-rs 1.6 refuses properties outside ``delta.*`` when a table is created but
accepts them through ``alter.set_table_properties``. A target that exists and is not empty is
refused, unless it is a Delta table and ``mode="overwrite"``: then a new table version replaces
the rows (the old files stay for time travel until a vacuum). Local folder or s3:// URI; on S3
the store's s3fs options are mapped to delta-rs's (``delta_storage_options``). Needs the
``delta`` extra.

A write that fails leaves what was there: into a target it created (none was there), the target
goes, unless a table version was committed to it; into an existing table, the files it wrote go,
unless the table's version moved on (a commit may name them). A full disk is one line
(:class:`~raycompat.store.maintenance.no_space.NoSpaceError`). Ctrl-C removes a target it created
even after the commit (the export did not finish), so that rerunning the same export writes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raycompat.errors import StoreError
from raycompat.io.filesystems import Backend, open_backend
from raycompat.io.prefetch import prefetch
from raycompat.store.formats.adopt_delta import delta_storage_options
from raycompat.store.formats.export import (
    ExportOptionError,
    check_outside_store,
    remove_target,
)
from raycompat.store.formats.snapshot import require
from raycompat.store.maintenance.no_space import NoSpaceError, no_space_left

if TYPE_CHECKING:
    from raycompat.store.gallery import GalleryStore

MODES = ("error", "overwrite")
# Arrow bytes a data file takes before the next begins: 3M rows of 8-d float32 (44 B a row in
# Arrow), 63 MB of Snappy Parquet for widened float16 values (21 B a row), where delta-rs's own
# target is 100 MB
FILE_BYTES = 128 << 20
logger = logging.getLogger(__name__)


def write(
    reader: pa.RecordBatchReader,
    target: str,
    properties: Callable[[], dict[str, str]],
    storage_options: dict | None,
    store: GalleryStore,
    *,
    mode: str = "error",
) -> int:
    """Write ``reader`` as the Delta table at ``target``; the number of data files of the
    table's new version."""
    deltalake = require("deltalake", "delta", "Delta", use="exporting")
    if mode not in MODES:
        raise ExportOptionError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    check_outside_store(store, target, "the Delta target")
    uri = target if "://" in target else os.path.abspath(target)
    created = _check_target(target, uri, storage_options, mode)
    options = delta_storage_options(storage_options) if uri.startswith("s3://") else None
    existing = None if created else _table_version(deltalake, uri, options)
    files = DataFiles(open_backend(uri, storage_options))
    try:
        files.write(reader)
        config = properties()  # the ids checked against the record before anything commits
        _commit(deltalake, uri, reader.schema, files.added, existing is not None, options)
        table = deltalake.DeltaTable(uri, storage_options=options)
        table.alter.set_table_properties(config, raise_if_not_exists=False)
        return len(table.file_uris())
    except BaseException as error:  # Ctrl-C too: a rerun must find no half-written target
        removed = _undo(error, deltalake, uri, storage_options, options, created, existing, files)
        if no_space_left(error):
            also = "; the folder this export created was removed" if removed else ""
            raise NoSpaceError(
                f"{target}: no space left on device; the Delta table was not written{also}"
            ) from None
        if isinstance(error, deltalake.exceptions.DeltaError):
            raise StoreError(
                f"{target}: the Delta table could not be written: {str(error).splitlines()[0]}"
            ) from None
        raise


class DataFiles:
    """The Parquet files of one export under a table's root, each closed with its Delta ``add``
    action (size, row count, null counts, min/max of the number and string columns)."""

    def __init__(self, backend: Backend):
        self.backend, self.prefix = backend, f"part-{{:05d}}-{uuid.uuid4()}-c000.snappy.parquet"
        self.names: list[str] = []  # every file opened, the one being written too
        self.added: list = []

    def write(self, reader: pa.RecordBatchReader) -> None:
        writer = stats = None
        try:
            for batch in prefetch(iter(reader), depth=2):  # the next read and cast meanwhile
                if writer is None:
                    writer, stats = self._open(reader.schema), FileStats(reader.schema)
                writer.write_batch(batch)
                stats.update(batch)
                if stats.nbytes >= FILE_BYTES:
                    self._close(writer, stats)
                    writer = None
            if writer is not None:
                self._close(writer, stats)
                writer = None
        finally:
            if writer is not None:  # a failure mid-file: its handle goes (the file, in _undo)
                with contextlib.suppress(Exception):
                    writer.close()

    def _open(self, schema: pa.Schema) -> pq.ParquetWriter:
        if not self.names:
            self.backend.filesystem.create_dir(self.backend.root, recursive=True)
        self.names.append(self.prefix.format(len(self.names)))
        return pq.ParquetWriter(
            f"{self.backend.root}/{self.names[-1]}",
            schema,
            filesystem=self.backend.filesystem,
            compression="snappy",
        )

    def _close(self, writer: pq.ParquetWriter, stats: FileStats) -> None:
        """Close the file being written and keep its ``add`` action."""
        from deltalake.transaction import AddAction

        writer.close()
        name = self.names[-1]
        size = self.backend.filesystem.get_file_info(f"{self.backend.root}/{name}").size
        now = int(time.time() * 1000)
        self.added.append(AddAction(name, size, {}, now, True, json.dumps(stats.to_dict())))

    def remove(self) -> None:
        """Delete the files opened (none committed); a failure is a warning."""
        for name in self.names:
            try:
                self.backend.filesystem.delete_file(f"{self.backend.root}/{name}")
            except FileNotFoundError:
                pass
            except OSError as error:
                logger.warning("%s: could not remove %s: %s", self.backend.root, name, error)


def _ranged(kind: pa.DataType) -> bool:
    """Whether Delta statistics keep a column's min/max here: numbers and strings (JSON has
    them as they are); vectors, dates and the rest get none (statistics are per column and
    optional)."""
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_string(kind)


class FileStats:
    """Delta's per-file statistics: ``numRecords``, each column's ``nullCount``, and
    ``minValues``/``maxValues`` of its number and string columns (:func:`_ranged`)."""

    def __init__(self, schema: pa.Schema):
        self.rows = self.nbytes = 0
        self.nulls = dict.fromkeys(schema.names, 0)
        self.ranged = [f.name for f in schema if _ranged(f.type)]
        self.low: dict = {}
        self.high: dict = {}

    def update(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        self.nbytes += batch.nbytes
        for name in self.nulls:
            self.nulls[name] += batch.column(name).null_count
        for name in self.ranged:
            found = pc.min_max(batch.column(name))
            low, high = found["min"].as_py(), found["max"].as_py()
            if low is not None:
                self.low[name] = low if name not in self.low else min(self.low[name], low)
                self.high[name] = high if name not in self.high else max(self.high[name], high)

    def to_dict(self) -> dict:
        return {
            "numRecords": self.rows,
            "minValues": self.low,
            "maxValues": self.high,
            "nullCount": self.nulls,
        }


def _commit(deltalake, uri: str, schema, added: list, exists: bool, options) -> None:
    """One table version adding ``added``: a new table, or one replacing an existing table's
    rows."""
    from deltalake.transaction import create_table_with_add_actions

    delta_schema = deltalake.Schema.from_arrow(schema)
    if exists:
        table = deltalake.DeltaTable(uri, storage_options=options)
        table.create_write_transaction(added, mode="overwrite", schema=delta_schema)
    else:
        create_table_with_add_actions(uri, delta_schema, added, storage_options=options)


def _check_target(target: str, uri: str, storage_options: dict | None, mode: str) -> bool:
    """Refuse a file, a non-empty folder that is no Delta table, and (unless ``mode`` is
    ``"overwrite"``) a Delta table; whether the target is not there yet (the write creates
    it)."""
    backend = open_backend(uri, storage_options)
    fs, root = backend.filesystem, backend.root
    found = fs.get_file_info(root).type
    if found == pafs.FileType.NotFound:
        return True
    if found == pafs.FileType.File:
        raise StoreError(f"{target} is a file; export to a new or empty folder")
    names = {e.base_name for e in fs.get_file_info(pafs.FileSelector(root))}
    if not names:
        return False
    if "_delta_log" not in names:
        raise StoreError(
            f"{target} is a folder holding {len(names)} entries and no Delta table; export to a "
            f"new or empty folder"
        )
    if mode != "overwrite":
        raise StoreError(
            f"{target} already holds a Delta table; --mode overwrite replaces its rows with a "
            f"new table version"
        )
    return False


def _committed(fs: pafs.FileSystem, root: str) -> bool:
    """Whether a table version was committed under ``root`` (a ``_delta_log/*.json``)."""
    log = fs.get_file_info(pafs.FileSelector(f"{root}/_delta_log", allow_not_found=True))
    return any(entry.base_name.endswith(".json") for entry in log)


def _table_version(deltalake, uri: str, options) -> int | None:
    """The Delta table's current version at ``uri``; None where there is no table."""
    if not deltalake.DeltaTable.is_deltatable(uri, storage_options=options):
        return None
    return deltalake.DeltaTable(uri, storage_options=options).version()


def _undo(error, deltalake, uri, storage_options, options, created, existing, files) -> bool:
    """Remove what a failed export wrote; whether the target it created was removed."""
    if created:
        # Ctrl-C: the export did not finish, even where its rows were committed (its
        # properties not set yet): a target it created goes whole, so that a rerun writes it
        keep = None if isinstance(error, KeyboardInterrupt) else _committed
        return remove_target(uri, storage_options, keep)
    if _table_version(deltalake, uri, options) == existing:  # no commit can name its files
        files.remove()
    return False
