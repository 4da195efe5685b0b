"""Writing an exported version as a Delta Lake table, through ``deltalake`` (delta-rs).

The batches stream into one ``write_deltalake`` commit (delta-rs rolls files by size, so memory
stays bounded). A second commit sets the table properties naming the source
(``raycompat.source.*``, ``export.py``): delta-rs 1.6 refuses properties outside ``delta.*`` on
the write itself but accepts them through ``alter.set_table_properties``. A target that exists
and is not empty is refused, unless it is a Delta table and ``mode="overwrite"``: then a new
table version replaces the rows (the old files stay for time travel until a vacuum). Local
folder or s3:// URI; on S3 the store's s3fs options are mapped to delta-rs's
(``delta_storage_options``). Needs the ``delta`` extra.

A write that fails into a target it created (none was there) removes that target, when no
table version was committed to it: a full disk leaves no empty or half-written folder, and is
one line (:class:`~raycompat.store.maintenance.no_space.NoSpaceError`). Ctrl-C removes such a
target even after the commit (the export did not finish), so that rerunning the same export
writes it.
delta-rs's tokio workers print a Rust panic to the process's stderr when a write fails under
them (``Already shut down``); what the write prints is held back (:func:`held_stderr`) and
shown only when it succeeds, or at DEBUG (``--verbose``) when it fails, so the failure stays
one line.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from raycompat.errors import StoreError
from raycompat.io.filesystems import open_backend
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
    printed = bytearray()
    try:
        with held_stderr() as printed:
            deltalake.write_deltalake(uri, reader, mode=mode, storage_options=options)
        _show(printed)  # it succeeded: what it printed (warnings), as it was
        table = deltalake.DeltaTable(uri, storage_options=options)
        table.alter.set_table_properties(properties(), raise_if_not_exists=False)
        return len(table.file_uris())
    except BaseException as error:  # Ctrl-C too: a rerun must find no half-written target
        if printed:
            logger.debug("delta-rs printed: %s", bytes(printed).decode(errors="replace"))
        # Ctrl-C: the export did not finish, even where its rows were committed (its
        # properties not set yet): a target it created goes whole, so that a rerun writes it
        interrupted = isinstance(error, KeyboardInterrupt)
        keep = None if interrupted else _committed
        removed = created and remove_target(uri, storage_options, keep)
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


@contextmanager
def held_stderr() -> Iterator[bytearray]:
    """Within the block, what this process writes to its stderr file descriptor (2: Rust's
    panic messages, C libraries, Python's own ``sys.stderr``) is held in the ``bytearray``
    yielded instead of printed. A pipe, drained by a thread, holds it: no file, so a full disk
    cannot lose it. Without a stderr descriptor the block runs as is."""
    held = bytearray()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, OSError, ValueError):
        yield held
        return
    read, write = os.pipe()
    drain = threading.Thread(target=_drain, args=(read, held), daemon=True)
    drain.start()
    os.dup2(write, 2)
    os.close(write)
    try:
        yield held
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes: the drain reads its end
        os.close(saved)
        drain.join()
        os.close(read)


def _show(printed: bytearray) -> None:
    if printed:
        try:
            os.write(2, bytes(printed))
        except OSError:  # no stderr to show it on
            pass


def _drain(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 65536):
        into.extend(chunk)
