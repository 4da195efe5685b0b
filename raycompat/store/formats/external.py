"""Adopted versions: Parquet files outside the store, pinned by the version record, read in place.

A version published by ``adopt`` (``adopt.py``, ``raycompat adopt``) owns no file under its
gallery. Its record's ``files`` are relative to ``external.root`` (a local folder or an S3
prefix), and each file is pinned by its byte size and its S3 ETag or local mtime; a Delta or
Iceberg snapshot also records ``"table": {"format": "delta", "version": 3}`` (its files are
exactly the snapshot's, ``snapshot.py``)::

    "external": {"root": "s3://bucket/tables/faces", "id_column": "image_id",
                 "embedding_column": "vec",
                 "pins": [{"path": "part-0.parquet", "bytes": 52113, "rows": 1000,
                           "etag": "\\"9b2cf535f27731c974343645a3985328\\"", "mtime_ns": null}]}

Every open of such a file (``GalleryStore.open_file``, the one place version files are opened)
first compares the file with its pin: a file that changed or vanished is a
:class:`ChangedFileError` naming it. The file is then read through :class:`AdoptedParquet`, which
shows it as a store part file: the id and embedding columns under the names ``id`` and
``embedding``, variable-length lists as ``fixed_size_list[width]``, no schema metadata (it
belongs to whoever wrote the file). Nothing in the store writes or deletes these files.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raycompat.errors import ChangedFileError, CorruptFileError, ManifestError
from raycompat.io.filesystems import Backend
from raycompat.store.paths import check_relative_path
from raycompat.store.read.parquet import open_parquet
from raycompat.store.records import check_record


@dataclass
class FilePin:
    """One external file: ``path`` relative to the root, and what it was when adopted."""

    path: str
    bytes: int
    rows: int
    etag: str | None = None  # S3
    mtime_ns: int | None = None  # local disk


@dataclass
class ExternalFiles:
    """The ``external`` entry of an adopted version's record (see the module docstring)."""

    root: str
    pins: list[FilePin] = field(default_factory=list)
    id_column: str = "id"
    embedding_column: str = "embedding"
    table: dict | None = None  # {"format": "delta"|"iceberg", "version": N} of a table snapshot

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.table is None:  # a plain Parquet folder: records as before table formats
            del out["table"]
        return out

    @classmethod
    def from_record(cls, info, source: str) -> ExternalFiles:
        """Schema-check ``info.external`` against ``info.files``; errors name ``source``."""
        raw, what = info.external, "version record key 'external'"
        pins = raw.get("pins")
        if not isinstance(pins, list) or not all(isinstance(p, dict) for p in pins):
            raise CorruptFileError(f"{source}: {what}: 'pins' must be a list of objects")
        for pin in pins:
            check_record(pin, FilePin, source, f"{what} pin")
            if (
                pin["bytes"] < 0
                or pin["rows"] < 0
                or (pin.get("etag") is None) == (pin.get("mtime_ns") is None)
            ):
                raise CorruptFileError(
                    f"{source}: {what} pin {pin['path']!r} needs bytes, rows >= 0 and exactly "
                    f"one of etag, mtime_ns"
                )
        parsed = {**raw, "pins": [FilePin(**p) for p in pins]}
        check_record(parsed, cls, source, what)
        _check_table(parsed.get("table"), source, what)
        external = cls(**parsed)
        if [p.path for p in external.pins] != info.files:
            raise CorruptFileError(f"{source}: {what} pins other files than 'files' lists")
        if sum(p.rows for p in external.pins) != info.rows:
            raise CorruptFileError(f"{source}: {what} pins {info.rows} rows in all, not 'rows'")
        root_uri(external.root, source)
        return external


def _check_table(table: dict | None, source: str, what: str) -> None:
    if table is not None and (
        set(table) != {"format", "version"}
        or table["format"] not in ("delta", "iceberg")
        or type(table["version"]) is not int
    ):
        raise CorruptFileError(
            f"{source}: {what} 'table' must hold 'format' (delta or iceberg) and 'version' "
            f"(an integer), got {table!r}"
        )


def root_uri(root: str, source: str) -> tuple[str, str]:
    """``(scheme, filesystem path)`` of an external root: ``s3://bucket/prefix`` or an absolute
    local folder, normalised (no ``..``, ``.``, ``//``)."""
    scheme, _, path = root.partition("://") if "://" in root else ("file", "", root)
    relative = path[1:] if scheme == "file" and path.startswith("/") else path
    if scheme not in ("file", "s3") or (scheme == "file") != path.startswith("/"):
        raise CorruptFileError(
            f"{source}: external root {root!r} must be an absolute folder or an s3:// prefix"
        )
    check_relative_path(relative, source)
    return scheme, path


def root_path(backend: Backend, external: dict, source: str) -> str:
    """The filesystem path of an adopted version's root on the store's ``backend``."""
    scheme, path = root_uri(external["root"], source)
    if scheme != backend.scheme:
        raise ManifestError(
            f"{source}: adopted files at {external['root']} are not on the store's "
            f"{backend.scheme} filesystem"
        )
    return path


def stat_file(backend: Backend, path: str) -> dict:
    """``{"bytes", "etag", "mtime_ns"}`` of a file now (a fresh HEAD on S3); FileNotFoundError."""
    if backend.head is not None:
        head = backend.head(path)
        if head.get("type") != "file":
            raise FileNotFoundError(path)
        return {"bytes": int(head["size"]), "etag": str(head["ETag"]), "mtime_ns": None}
    found = backend.filesystem.get_file_info(path)
    if found.type != pafs.FileType.File:
        raise FileNotFoundError(path)
    return {"bytes": found.size, "etag": None, "mtime_ns": found.mtime_ns}


def check_pin(backend: Backend, path: str, source: str, pin: FilePin) -> None:
    """Raise :class:`ChangedFileError` unless the file is still what ``pin`` says."""
    try:
        now = stat_file(backend, path)
    except FileNotFoundError:
        raise ChangedFileError(
            f"{source}: this file of an adopted version is gone (pinned at {pin.bytes} bytes); "
            f"restore it, or adopt the table again under a new version name"
        ) from None
    changed = [
        f"{key} {getattr(pin, key)!r} -> {now[key]!r}"
        for key in ("bytes", "etag", "mtime_ns")
        if getattr(pin, key) is not None and getattr(pin, key) != now[key]
    ]
    if changed:
        raise ChangedFileError(
            f"{source}: this file of an adopted version changed since it was pinned "
            f"({', '.join(changed)}); adopt the table again under a new version name"
        )


@contextmanager
def open_adopted(backend: Backend, info, path: str, source: str) -> Iterator[AdoptedParquet]:
    """Check the file's pin, then open it as a store part file (see :class:`AdoptedParquet`)."""
    base = root_path(backend, info.external, source)
    pin = FilePin(**info.external["pins"][info.files.index(path[len(base) + 1 :])])
    check_pin(backend, path, source, pin)
    with open_parquet(backend.filesystem, path, source) as parquet:
        yield AdoptedParquet(parquet, renames(info.external), info.width)


def renames(external: dict) -> dict[str, str]:
    """``{source column: store column}`` for the id and embedding columns that are renamed."""
    names = {external["id_column"]: "id", external["embedding_column"]: "embedding"}
    return {k: v for k, v in names.items() if k != v}


def is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def vector_type(list_type: pa.DataType, width: int) -> pa.DataType:
    """The store's type for an embedding column of ``list_type``: ``fixed_size_list[width]``."""
    return pa.list_(list_type.value_type, width)


def store_schema(schema: pa.Schema, names: dict[str, str], width: int) -> pa.Schema:
    fields = []
    for f in schema:
        name = names.get(f.name, f.name)
        if name == "embedding" and is_list(f.type):
            f = f.with_type(vector_type(f.type, width))
        fields.append(f.with_name(name))
    return pa.schema(fields)


def as_store_columns(data: pa.Table | pa.RecordBatch, names: dict[str, str], width: int):
    """``data`` with store column names, fixed-width embeddings and no schema metadata."""
    schema = store_schema(data.schema, names, width)
    columns = [
        c if c.type == f.type else c.cast(f.type) for c, f in zip(data.columns, schema, strict=True)
    ]
    return type(data).from_arrays(columns, schema=schema)


class AdoptedParquet:
    """A ``pq.ParquetFile`` of an adopted file seen as a store part file: the same
    ``schema_arrow``, ``metadata``, ``iter_batches`` and ``read``, in store columns."""

    def __init__(self, parquet: pq.ParquetFile, names: dict[str, str], width: int):
        self._parquet, self._names, self._width = parquet, names, width
        self._sources = {v: k for k, v in names.items()}
        self.metadata = parquet.metadata
        self.schema_arrow = store_schema(parquet.schema_arrow, names, width)

    def _columns(self, columns: list[str] | None) -> list[str] | None:
        return None if columns is None else [self._sources.get(c, c) for c in columns]

    def iter_batches(self, batch_size=65536, row_groups=None, columns=None, **kwargs):
        batches = self._parquet.iter_batches(
            batch_size=batch_size, row_groups=row_groups, columns=self._columns(columns), **kwargs
        )
        for batch in batches:
            yield as_store_columns(batch, self._names, self._width)

    def read(self, columns=None, **kwargs) -> pa.Table:
        table = self._parquet.read(columns=self._columns(columns), **kwargs)
        return as_store_columns(table, self._names, self._width)
