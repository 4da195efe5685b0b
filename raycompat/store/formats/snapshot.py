"""Which kind of table a folder holds, and the exact files of the snapshot ``adopt`` pins.

    snapshot = read_snapshot(store, "bucket/tables/faces", "s3://bucket/tables/faces", None)
    snapshot.format, snapshot.files, snapshot.sizes, snapshot.version

A table format keeps a log of which data files make up each version; deleted or replaced files
stay in the folder until a vacuum. Listing the folder's ``*.parquet`` files would therefore
resurrect deleted rows, so a folder is classified from its top level alone (one listing) by the
detectors of :data:`FORMATS`, in order: Delta (``_delta_log/``), Iceberg (``metadata/`` holding
``*.metadata.json``), Hudi (``.hoodie/``), Lance (``*.lance`` or ``_versions/``). A detected
format is read through its own library (``adopt_delta.py``, ``adopt_iceberg.py``) or refused with
one line naming the format and what to do; a folder with no table log is a plain Parquet folder,
whose ``*.parquet`` files are the table. No Ray here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from raycompat.errors import StoreError

if TYPE_CHECKING:
    from raycompat.store.gallery import GalleryStore


class UnsupportedTableError(StoreError):
    """The folder holds a table of a format ``adopt`` does not read, or a feature of one it
    cannot pin as files (row-level deletes)."""


@dataclass
class TableSnapshot:
    """The files of one version of a table: ``files`` relative to its root, ``sizes`` their
    bytes as the table's log records them, ``version`` the Delta version or Iceberg snapshot."""

    format: str
    files: list[str]
    sizes: dict[str, int] = field(default_factory=dict)
    version: int | None = None

    def identity(self) -> dict | None:
        """``{"format", "version"}`` of a table format, for lineage; None for plain Parquet."""
        return (
            None if self.format == "parquet" else {"format": self.format, "version": self.version}
        )


# read(store, root, uri, as_of) -> TableSnapshot; root is a filesystem path, uri names it
Reader = Callable[["GalleryStore", str, str, "int | datetime | None"], TableSnapshot]


@dataclass(frozen=True)
class TableFormat:
    """A format: ``detect(filesystem, root, top-level names)``, and its ``read`` or, for a
    format adopt refuses, ``advice`` saying what to do instead."""

    detect: Callable[[pafs.FileSystem, str, dict[str, pafs.FileType]], bool]
    read: Reader | None = None
    advice: str = ""


def _has_dir(name: str) -> Callable:
    return lambda fs, root, top: top.get(name) == pafs.FileType.Directory


def _iceberg(fs: pafs.FileSystem, root: str, top: dict[str, pafs.FileType]) -> bool:
    if top.get("metadata") != pafs.FileType.Directory:
        return False
    found = fs.get_file_info(pafs.FileSelector(f"{root}/metadata"))
    return any(e.path.endswith(".metadata.json") for e in found)


def _lance(fs: pafs.FileSystem, root: str, top: dict[str, pafs.FileType]) -> bool:
    return root.endswith(".lance") or _has_dir("_versions")(fs, root, top)


def _reader(module: str) -> Reader:
    """``module.read_snapshot``, imported when a table of that format is adopted."""
    return lambda *args: importlib.import_module(module).read_snapshot(*args)


EXPORT = "export it to Parquet or Delta first and adopt that"
FORMATS: dict[str, TableFormat] = {
    "delta": TableFormat(_has_dir("_delta_log"), _reader("raycompat.store.formats.adopt_delta")),
    "iceberg": TableFormat(_iceberg, _reader("raycompat.store.formats.adopt_iceberg")),
    "hudi": TableFormat(_has_dir(".hoodie"), advice=EXPORT),
    "lance": TableFormat(_lance, advice=EXPORT),
}


def detect_format(fs: pafs.FileSystem, root: str) -> str:
    """The name in :data:`FORMATS` of the table in folder ``root``, or ``"parquet"``."""
    top = {
        e.path.rstrip("/").rsplit("/", 1)[-1]: e.type
        for e in fs.get_file_info(pafs.FileSelector(root, recursive=False))
    }
    return next((name for name, f in FORMATS.items() if f.detect(fs, root, top)), "parquet")


def read_snapshot(store: GalleryStore, root: str, uri: str, as_of: str | None) -> TableSnapshot:
    """The files to adopt from folder ``root`` (``uri`` names it in errors): a table format's
    snapshot (the current one, or ``as_of``), or a plain folder's ``*.parquet`` files."""
    name = detect_format(store.backend.filesystem, root)
    if name == "parquet":
        if as_of is not None:
            raise StoreError(
                f"{uri}: --as-of applies to Delta and Iceberg tables; this folder holds no "
                f"table log (_delta_log/, metadata/), only Parquet files"
            )
        return TableSnapshot("parquet", list_parquet(store.backend.filesystem, root, uri))
    table = FORMATS[name]
    if table.read is None:
        raise UnsupportedTableError(
            f"{uri} is a {name.capitalize()} table, which adopt does not read (its Parquet "
            f"files may hold deleted or superseded rows); {table.advice}"
        )
    return table.read(store, root, uri, None if as_of is None else parse_as_of(as_of))


def list_parquet(fs: pafs.FileSystem, root: str, uri: str) -> list[str]:
    """The ``*.parquet`` files under ``root`` (recursively), relative to it, skipping paths
    with a segment starting with ``_`` or ``.`` (``_SUCCESS``, ``.crc`` files)."""
    files = sorted(
        e.path[len(root) + 1 :]
        for e in fs.get_file_info(pafs.FileSelector(root, recursive=True))
        if e.type == pafs.FileType.File
        and e.path.endswith(".parquet")
        and not any(s.startswith(("_", ".")) for s in e.path[len(root) + 1 :].split("/"))
    )
    if not files:
        raise StoreError(f"{uri}: no Parquet files (*.parquet) to adopt")
    return files


def parse_as_of(text: str) -> int | datetime:
    """``--as-of``: an integer (a Delta version, an Iceberg snapshot id) or an ISO timestamp
    (UTC unless it names a zone). StoreError (a ValueError) otherwise."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise StoreError(
            f"--as-of {text!r} is neither a version/snapshot number nor an ISO timestamp "
            f"(2026-01-31T12:00:00)"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def relative_file(root: str, file_uri: str, uri: str) -> str:
    """The path under ``root`` of a data file the table's log names by URI; StoreError for a
    file outside the table's folder (the record pins files relative to it)."""
    scheme, colon, rest = file_uri.partition(":")
    if not colon or "/" in scheme:  # a plain local path
        path = file_uri
    else:  # file:/x, file:///x; s3://, s3a:// (Spark) name bucket/key
        path = ("/" if scheme == "file" else "") + rest.lstrip("/")
    if not path.startswith(root.rstrip("/") + "/"):
        raise UnsupportedTableError(
            f"{uri}: its data file {file_uri} lies outside the table's folder; adopt pins files "
            f"under the table's root only"
        )
    return path[len(root.rstrip("/")) + 1 :]


def require(module: str, extra: str, what: str, use: str = "adopting"):
    """Import ``module`` (a table format's library), or a one-line error naming the extra;
    ``use`` says what needs it (``"adopting"``, ``"exporting"``)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise StoreError(
            f"{use} {what} tables needs the {module} package: pip install 'raycompat[{extra}]'"
        ) from None
