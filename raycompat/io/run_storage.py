"""Where a run lives: a local folder or an ``s3://`` prefix, through one pyarrow filesystem.

The filesystem comes from the one resolver, :func:`raycompat.io.uri.filesystem`, with
the run's ``storage_options`` (s3fs's, as the store's: credentials, ``client_kwargs.endpoint_url``
of an S3-compatible store); what they leave out comes from the environment
(``AWS_ACCESS_KEY_ID`` ...) or the instance role. The small JSON and text files of a run are
written whole through it (S3 objects cannot be appended to).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from raycompat.io.uri import filesystem

if TYPE_CHECKING:  # a type only: io/ imports nothing above it
    from raycompat.config.train import RunSpec


def run_filesystem(run: RunSpec) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, base path)`` of ``run.storage_path`` (absolute for local folders)."""
    try:
        return filesystem(run.storage_path, run.storage_options)
    except ValueError as err:
        raise ValueError(f"run.storage_path: {err}") from None


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    """The bytes at ``path``, or None when there is none."""
    if not exists(fs, path):
        return None
    with fs.open_input_stream(path) as stream:
        return stream.read()


def read_json(fs: pafs.FileSystem, path: str):
    """The JSON at ``path``, or None when there is none."""
    data = read_bytes(fs, path)
    return None if data is None else json.loads(data.decode())


def write_json(fs: pafs.FileSystem, path: str, value) -> None:
    """Write ``value`` to ``path`` whole: S3 objects appear atomically; locally a rename does."""
    write_bytes(fs, path, json.dumps(value, indent=2, default=float).encode())


def read_lines(fs: pafs.FileSystem, path: str) -> list[str]:
    """The lines of the text file at ``path`` (what :func:`append_line` wrote), or ``[]``."""
    data = read_bytes(fs, path)
    return [] if data is None else data.decode().splitlines()


def append_line(fs: pafs.FileSystem, path: str, line: str) -> None:
    """Add ``line`` to the text file at ``path`` (created if absent). S3 objects cannot be
    appended to, so the file is read and written whole (fine for a line per epoch)."""
    before = read_bytes(fs, path) or b""
    write_bytes(fs, path, before + line.encode() + b"\n")


def write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole (see :func:`write_json`)."""
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{path}.tmp-{os.getpid()}"
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
        return
    with fs.open_output_stream(path) as out:
        out.write(data)


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def touch(fs: pafs.FileSystem, path: str) -> None:
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(b"")


def replace_dir(fs: pafs.FileSystem, local: str, destination: str) -> None:
    """Copy local folder ``local`` to ``destination`` on ``fs``, replacing an earlier attempt's
    copy (the caller's own run folder: a retried or rerun step writes it again)."""
    if exists(fs, destination):
        fs.delete_dir(destination)
    fs.create_dir(destination, recursive=True)  # local folders are not made by copy_files
    pafs.copy_files(local, destination, pafs.LocalFileSystem(), fs)
