"""Filesystem backends of the store: local disk and S3, picked by the root URI's scheme.

A :class:`Backend` bundles the ``pyarrow.fs.FileSystem`` for bulk Parquet I/O, which comes from
the one I/O resolver (:func:`raycompat.io.uri.filesystem`: the store's ``storage_options`` are
the same s3fs options as everyone's), with the small writes the manifest protocol needs:
``create_exclusive`` (create-if-absent, atomic, raises ``FileExistsError``; returns a *stamp* of
what it wrote), ``replace_if`` (overwrite a file only if it is still the one this writer last
wrote, by its stamp; never creates one; raises :class:`ChangedError` otherwise: the lease
heartbeat's fencing) and ``replace`` (atomic overwrite, for index pointers and plans that are
not fenced), and ``read`` (a small record read whole, in one request, so that a concurrent
overwrite is seen entirely or not at all).

- Local: records are written to a temporary file, fsynced, then hard-linked to their name
  (``link`` fails if the name exists, atomically, on every POSIX filesystem) or ``os.replace``d.
  The stamp is ``(inode, size, mtime_ns)``; ``replace_if`` compares it with a fresh ``stat``
  just before its ``os.replace`` (POSIX has no compare-and-swap on a name, so a change in the
  microseconds between the two goes unseen: docs/store.md, "What a stalled writer can do").
- S3: records go through s3fs ``pipe_file(mode="create")``, a single PutObject with
  ``If-None-Match: *`` (S3 conditional writes), and ``replace_if`` is a PutObject with
  ``If-Match: <ETag>`` (the stamp). pyarrow's native S3 client cannot send those headers, so
  s3fs is needed for the records even when bulk I/O is native. A record that can be rewritten
  (a lease, an index pointer) is read with one whole-object GET (``cat_file``): pyarrow's
  native reader asks for the size first and then a byte range, so a heartbeat landing between
  the two returns a torn record (measured on the moto server: about half of the reads of a
  lease rewritten in a loop).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from raycompat.errors import StoreError
from raycompat.io.uri import filesystem, s3fs_filesystem, split_uri
from raycompat.registry import Registry

BACKENDS: Registry[Backend] = Registry("store filesystem scheme")


@dataclass
class Backend:
    """How one store root is accessed. ``root`` is a filesystem path (``bucket/prefix`` on S3)."""

    scheme: str
    filesystem: pafs.FileSystem
    root: str
    create_exclusive: Callable[[str, bytes], Any]
    replace: Callable[[str, bytes], None]
    # ``replace_if(path, data, stamp) -> new stamp``: see the module docstring.
    replace_if: Callable[[str, bytes, Any], Any]
    # ``read(path) -> bytes``: a small record, whole, as one write left it (FileNotFoundError
    # if absent); for any file ``replace``/``replace_if`` may overwrite.
    read: Callable[[str], bytes]
    # S3 only: a fresh HEAD of an object through s3fs (``size``, ``ETag``); pyarrow returns no
    # ETags. Adopted versions pin their external files by it (``store/formats/external.py``).
    head: Callable[[str], dict] | None = None

    def uri(self, path: str) -> str:
        return path if self.scheme == "file" else f"{self.scheme}://{path}"


def open_backend(root: str, storage_options: dict | None = None, bulk_io: str = "auto") -> Backend:
    """Build the backend for ``root`` (``"s3://bucket/prefix"`` or a local path)."""
    scheme, rest = split_uri(root)
    return BACKENDS.create(scheme, path=rest, options=dict(storage_options or {}), bulk_io=bulk_io)


class ChangedError(StoreError):
    """``replace_if`` found the file gone or replaced by another writer; nothing was written."""


def local_write(path: str, data: bytes, publish: Callable[[str, str], None]) -> tuple:
    """Write ``data`` to ``path`` through an fsynced temporary file; returns the stamp."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}")
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        publish(tmp, path)
        return local_stamp(path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def local_read(path: str) -> bytes:
    with open(path, "rb") as handle:  # os.replace swaps the inode: this one stays whole
        return handle.read()


def local_stamp(path: str) -> tuple:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def local_replace_if(path: str, data: bytes, stamp: Any) -> tuple:
    try:
        found = local_stamp(path)
    except FileNotFoundError:
        raise ChangedError(f"{path} no longer exists") from None
    if stamp is None or found != tuple(stamp):
        raise ChangedError(f"{path} was replaced by another writer")
    return local_write(path, data, os.replace)


def s3_replace_if(s3: Any, path: str, data: bytes, stamp: Any) -> str | None:
    if stamp is None:
        raise ChangedError(f"s3://{path}: no ETag of this writer's last write to compare")
    try:
        out = s3.pipe_file(path, data, IfMatch=stamp)
    except (FileNotFoundError, FileExistsError) as error:  # 404, or 412 Precondition Failed
        raise ChangedError(f"s3://{path} was removed or replaced ({error})") from None
    except OSError as error:
        if _precondition_failed(error):
            raise ChangedError(f"s3://{path} was replaced by another writer") from None
        raise
    return etag(out)


def _precondition_failed(error: OSError) -> bool:
    """s3fs wraps a 412 in a bare ``OSError``; the botocore error it chains names the code."""
    code = getattr(error.__cause__, "response", {}).get("Error", {}).get("Code")
    return code in ("PreconditionFailed", "412") or "pre-conditions" in str(error)


def etag(response: Any) -> str | None:
    return response.get("ETag") if isinstance(response, dict) else None


@BACKENDS.register("file")
def _local(*, path: str, options: dict, bulk_io: str) -> Backend:
    if options:
        raise StoreError(f"storage_options {sorted(options)} are not used for local root {path!r}")
    return Backend(
        "file",
        pafs.LocalFileSystem(),
        os.path.abspath(path),
        create_exclusive=lambda p, data: local_write(p, data, os.link),
        replace=lambda p, data: local_write(p, data, os.replace),
        replace_if=local_replace_if,
        read=local_read,
    )


@BACKENDS.register("s3")
def _s3(*, path: str, options: dict, bulk_io: str) -> Backend:
    bulk, root = filesystem(f"s3://{path}", options, bulk_io)
    s3 = s3fs_filesystem(options)  # the version records' conditional PUTs
    return Backend(
        "s3",
        bulk,
        root,
        create_exclusive=lambda p, data: etag(s3.pipe_file(p, data, mode="create")),
        replace=lambda p, data: s3.pipe_file(p, data),
        replace_if=lambda p, data, stamp: s3_replace_if(s3, p, data, stamp),
        read=lambda p: s3.cat_file(p),
        head=lambda p: s3.info(p, refresh=True),
    )
