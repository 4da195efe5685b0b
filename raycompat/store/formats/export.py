"""Exporting a published version as a Delta Lake or Iceberg table, readable without raycompat.

    summary = export_version(store, "faces", "v3", "delta", "s3://bucket/tables/faces_v3")
    summary = export_version(store, "faces", "v3", "iceberg", "gallery.faces_v3",
                             catalog_uri="sqlite:///catalog.db", warehouse="s3://bucket/wh")
    print(summary.line())

The version is streamed batch by batch (``GalleryStore.iter_batches``: validated against its
record, bounded memory) into the writer of :data:`EXPORTERS` (``export_delta.py``,
``export_iceberg.py``, each imported only when used). Vectors become ``list<float32>``: neither
format has a float16 type, so a float16 version is widened to float32 (the summary says so), and
neither has a fixed-size list (the width is a table property). The ids streamed are
fingerprinted and must match the record's fingerprint; the table's properties then record the
source (:func:`source_properties`). No Ray here.
"""

from __future__ import annotations

import importlib
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs

from raycompat.errors import ManifestError, StoreError, UsageError
from raycompat.io.filesystems import open_backend
from raycompat.registry import Registry
from raycompat.store.commit.part_record import IdFingerprint
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import VersionInfo

VECTOR_COLUMNS = ("embedding", "side_info")
PROPERTY_PREFIX = "raycompat.source."


class ExportOptionError(UsageError, StoreError):
    """An option given to a format that does not take it, or one the format needs missing: a
    usage error (``raycompat export`` exits 2)."""


@dataclass(frozen=True)
class ExportFormat:
    """A table format, written by ``raycompat.store.formats.export_<key>``, whose ``write(reader,
    target, properties, storage_options, store, **options)`` returns the number of data files
    written (``properties()`` gives the table properties once the reader is drained);
    ``options`` are those it takes, ``required`` those it needs."""

    key: str
    name: str
    options: tuple[str, ...] = ()
    required: tuple[str, ...] = ()

    def write(self, *args, **options) -> int:
        return importlib.import_module(f"raycompat.store.formats.export_{self.key}").write(
            *args, **options
        )


EXPORTERS: Registry[ExportFormat] = Registry("export format")
for _format in (
    ExportFormat("delta", "Delta", ("mode",)),
    ExportFormat("iceberg", "Iceberg", ("catalog_uri", "warehouse"), ("catalog_uri", "warehouse")),
):
    EXPORTERS.register(_format.key)(lambda f=_format: f)


@dataclass
class ExportSummary:
    """What an export wrote: ``dtype`` the version's, ``exported_dtype`` the table's."""

    format: str
    target: str
    gallery: str
    version: str
    rows: int
    files: int
    dtype: str
    exported_dtype: str = "float32"
    properties: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        """One line for the CLI, stating a float16 -> float32 widening."""
        widened = (
            f"; {self.dtype} embeddings widened to {self.exported_dtype} "
            f"({EXPORTERS.create(self.format).name} has no {self.dtype} type)"
            if self.dtype != self.exported_dtype
            else ""
        )
        return (
            f"exported {self.gallery} {self.version}: {self.rows:,} rows in {self.files} "
            f"file(s) as the {EXPORTERS.create(self.format).name} table {self.target}{widened}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def export_version(
    store: GalleryStore,
    gallery: str,
    version: str,
    format: str,
    target: str,
    *,
    batch_size: int = 65536,
    storage_options: dict | None = None,
    **options,
) -> ExportSummary:
    """Write ``gallery``'s ``version`` as a ``format`` table at ``target`` (Delta: a folder or
    s3:// URI; Iceberg: ``namespace.table`` in the catalog ``catalog_uri``).

    Args:
        storage_options: s3fs options for an s3:// target or warehouse (default: the
            store's when the target is on S3, none for a local one).
        options: the format's own (Delta ``mode="error"|"overwrite"``; Iceberg ``catalog_uri``,
            ``warehouse``); None values count as not given.
    Raises:
        ExportOptionError: an option the format does not take, or a required one missing.
        StoreError: no such gallery or version, an existing target, a version failing its
            checks, a missing package (naming the extra).
    """
    exporter = EXPORTERS.create(format)
    options = _check_options(exporter, format, {k: v for k, v in options.items() if v is not None})
    info = store.version(gallery, version)
    ids = IdFingerprint()
    schema, batches = _widened(store.iter_batches(gallery, version, batch_size), ids, info)

    def properties() -> dict[str, str]:  # called by the writer once every batch is written
        return source_properties(gallery, info, _checked(ids, info, store.uri(gallery)))

    files = exporter.write(
        pa.RecordBatchReader.from_batches(schema, batches),
        target,
        properties,
        _target_options(store, target, storage_options, options),
        store,
        **options,
    )
    return ExportSummary(
        format, target, gallery, version, info.rows, files, info.dtype, properties=properties()
    )


def _target_options(store: GalleryStore, target: str, given: dict | None, options: dict) -> dict:
    """The S3 options for the target: those given, else the store's when the target (or the
    Iceberg warehouse) is on S3, else none (a local folder takes none)."""
    if given is not None:
        return given
    where = (target, str(options.get("warehouse") or ""))
    return store.storage_options if any(w.startswith("s3://") for w in where) else {}


def _check_options(exporter: ExportFormat, format: str, options: dict) -> dict:
    for name in options:
        if name not in exporter.options:
            raise ExportOptionError(
                f"--{name.replace('_', '-')} does not apply to --format {format}; it takes "
                f"{', '.join('--' + o.replace('_', '-') for o in exporter.options) or 'none'}"
            )
    missing = [f"--{name.replace('_', '-')}" for name in exporter.required if name not in options]
    if missing:
        raise ExportOptionError(f"--format {format} needs {' and '.join(missing)}")
    return options


def _widened(
    batches: Iterator[pa.RecordBatch], ids: IdFingerprint, info: VersionInfo
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The exported schema (the version's columns, vectors as ``list<float32>``, no schema
    metadata), from the first batch, and the batches cast to it, their ids added to ``ids``."""
    first = next(batches, None)
    if first is None:
        raise StoreError(f"version {info.version} holds no rows; there is nothing to export")
    schema = pa.schema(
        pa.field(f.name, pa.list_(pa.float32()), f.nullable) if f.name in VECTOR_COLUMNS else f
        for f in first.schema
    )

    def cast() -> Iterator[pa.RecordBatch]:
        for batch in itertools.chain([first], batches):
            ids.update(batch.column("id"))
            yield batch.cast(schema)

    return schema, cast()


def check_outside_store(store: GalleryStore, uri: str, what: str) -> None:
    """Refuse an export ``uri`` inside the store's root (its writers and gc manage it)."""
    scheme, _, rest = uri.partition("://") if "://" in uri else ("file", "", uri)
    path = os.path.abspath(rest) if scheme == "file" else rest.strip("/")
    root = store.backend.root
    if scheme == store.backend.scheme and (path == root or path.startswith(root + "/")):
        raise StoreError(f"{what} {uri} is inside the store {store.root}; export outside it")


def remove_target(
    uri: str,
    storage_options: dict | None,
    keep: Callable[[pafs.FileSystem, str], bool] | None = None,
) -> bool:
    """Delete the folder a failed export wrote into, which was absent (or empty) before it,
    so that every file there is the export's; unless ``keep(filesystem, root)`` holds (Delta:
    a table version was committed). Whether it was removed; a failure to remove is a warning,
    the export's own error being the one to report."""
    backend = open_backend(uri, storage_options)
    fs, root = backend.filesystem, backend.root
    try:
        if fs.get_file_info(root).type == pafs.FileType.NotFound or (keep and keep(fs, root)):
            return False
        fs.delete_dir(root)
    except OSError as error:
        logging.getLogger(__name__).warning(
            "%s: could not remove what the failed export wrote: %s", uri, error
        )
        return False
    return True


def _checked(ids: IdFingerprint, info: VersionInfo, where: str) -> dict:
    """The fingerprint of the ids exported, which must be the record's when it has one."""
    if info.ids is not None and IdFingerprint.from_dict(info.ids) != ids:
        raise ManifestError(
            f"{where}: version {info.version}'s record fingerprints its ids as "
            f"{IdFingerprint.from_dict(info.ids)}; its files hold {ids}"
        )
    return ids.to_dict()


def source_properties(gallery: str, info: VersionInfo, ids: dict) -> dict[str, str]:
    """The table properties naming the source: ``raycompat.source.<key>`` -> string."""
    source = {
        "gallery": gallery,
        "version": info.version,
        "model_version": info.model_version,
        "rows": str(info.rows),
        "ids": json.dumps(ids, sort_keys=True),
        "width": str(info.width),
        "dtype": info.dtype,
        "normalized": str(info.normalized).lower(),
        "lineage": info.lineage,
        "created": info.created,
    }
    return {PROPERTY_PREFIX + key: value for key, value in source.items()}
