"""Writing an exported version as a Delta Lake table, through ``deltalake`` (delta-rs).

The batches stream into one ``write_deltalake`` commit (delta-rs rolls files by size, so memory
stays bounded). A second commit sets the table properties naming the source
(``raycompat.source.*``, ``export.py``): delta-rs 1.6 refuses properties outside ``delta.*`` on
the write itself but accepts them through ``alter.set_table_properties``. A target that exists
and is not empty is refused, unless it is a Delta table and ``mode="overwrite"``: then a new
table version replaces the rows (the old files stay for time travel until a vacuum). Local
folder or s3:// URI; on S3 the store's s3fs options are mapped to delta-rs's
(``delta_storage_options``). Needs the ``delta`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from raycompat.errors import StoreError
from raycompat.io.filesystems import open_backend
from raycompat.store.formats.adopt_delta import delta_storage_options
from raycompat.store.formats.export import ExportOptionError, check_outside_store
from raycompat.store.formats.snapshot import require

if TYPE_CHECKING:
    from raycompat.store.gallery import GalleryStore

MODES = ("error", "overwrite")


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
    _check_target(target, uri, storage_options, mode)
    options = delta_storage_options(storage_options) if uri.startswith("s3://") else None
    try:
        deltalake.write_deltalake(uri, reader, mode=mode, storage_options=options)
        table = deltalake.DeltaTable(uri, storage_options=options)
        table.alter.set_table_properties(properties(), raise_if_not_exists=False)
        return len(table.file_uris())
    except deltalake.exceptions.DeltaError as error:
        raise StoreError(
            f"{target}: the Delta table could not be written: {str(error).splitlines()[0]}"
        ) from None


def _check_target(target: str, uri: str, storage_options: dict | None, mode: str) -> None:
    """Refuse a file, a non-empty folder that is no Delta table, and (unless ``mode`` is
    ``"overwrite"``) a Delta table."""
    backend = open_backend(uri, storage_options)
    fs, root = backend.filesystem, backend.root
    found = fs.get_file_info(root).type
    if found == pafs.FileType.NotFound:
        return
    if found == pafs.FileType.File:
        raise StoreError(f"{target} is a file; export to a new or empty folder")
    names = {e.base_name for e in fs.get_file_info(pafs.FileSelector(root))}
    if not names:
        return
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
