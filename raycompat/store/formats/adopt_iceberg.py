"""An Iceberg table's snapshot, read through ``pyiceberg``, for ``adopt``.

The table folder's newest ``metadata/*.metadata.json`` (the highest version number in its name,
``00003-<uuid>.metadata.json`` or ``v3.metadata.json``) is loaded with
``StaticTable.from_metadata``; the current snapshot, or the one ``--as-of`` names (a snapshot id
or a timestamp), is planned with ``scan().plan_files()``, whose data files ``adopt`` pins (path,
size). Refused, with one line naming the table: delete files (v2 positional or equality deletes,
v3 deletion vectors: the data file alone would resurrect those rows), data files that are not
Parquet, two metadata files of the same version (a failed commit left one; only the catalog
knows which is current). Needs the ``iceberg`` extra.

A table named through a catalog (``iceberg:<namespace>.<table>``, ``load_catalog_table``) is
loaded from the SQL catalog ``raycompat export`` writes (name ``raycompat``), which knows its
current metadata file; its snapshot then takes the same path (``table_snapshot``), with the
table's location as the root.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from raycompat.errors import StoreError
from raycompat.store.formats.snapshot import (
    TableSnapshot,
    UnsupportedTableError,
    relative_file,
    require,
)

if TYPE_CHECKING:
    from raycompat.store.gallery import GalleryStore

CATALOG_NAME = "raycompat"  # the SQL catalog's name, as export writes it and adopt reads it
LISTED = 20  # tables named in the error for a missing one
METADATA_NAME = re.compile(r"^v?(\d+)[-.].*\.metadata\.json$")
S3FS_TO_ICEBERG = {
    "key": "s3.access-key-id",
    "secret": "s3.secret-access-key",
    "token": "s3.session-token",
}


def iceberg_properties(options: dict | None) -> dict[str, str]:
    """pyiceberg's FileIO properties for the store's s3fs ``storage_options``."""
    options = options or {}
    client = options.get("client_kwargs") or {}
    out = {ice: str(options[s3fs]) for s3fs, ice in S3FS_TO_ICEBERG.items() if options.get(s3fs)}
    if client.get("endpoint_url") or options.get("endpoint_url"):
        out["s3.endpoint"] = client.get("endpoint_url") or options["endpoint_url"]
    if client.get("region_name"):
        out["s3.region"] = client["region_name"]
    return out


def newest_metadata(fs: pafs.FileSystem, root: str, uri: str) -> str:
    """The path of the highest-numbered ``metadata/*.metadata.json`` of the table at ``root``."""
    numbered = {}
    for entry in fs.get_file_info(pafs.FileSelector(f"{root}/metadata")):
        match = METADATA_NAME.match(entry.path.rsplit("/", 1)[-1])
        if match:
            numbered.setdefault(int(match.group(1)), []).append(entry.path)
    if not numbered:
        raise StoreError(f"{uri}: metadata/ holds no numbered *.metadata.json")
    newest = numbered[max(numbered)]
    if len(newest) > 1:
        raise UnsupportedTableError(
            f"{uri}: metadata/ holds {len(newest)} metadata files of version {max(numbered)} "
            f"({', '.join(p.rsplit('/', 1)[-1] for p in sorted(newest))}); a failed commit left "
            f"one, and only the table's catalog knows which is current: remove the orphan"
        )
    return newest[0]


def read_snapshot(
    store: GalleryStore, root: str, uri: str, as_of: int | datetime | None
) -> TableSnapshot:
    """The data files (relative to ``root``) and sizes of the Iceberg table at ``uri``, at its
    current snapshot or ``as_of``; StoreError if it cannot be read at that snapshot."""
    require("pyiceberg", "iceberg", "Iceberg")
    from pyiceberg.table import StaticTable

    metadata = store.backend.uri(newest_metadata(store.backend.filesystem, root, uri))
    try:
        table = StaticTable.from_metadata(metadata, iceberg_properties(store.storage_options))
    except (OSError, ValueError) as error:
        raise StoreError(
            f"{uri}: the Iceberg table could not be read from {metadata}: "
            f"{str(error).splitlines()[0]}"
        ) from None
    return table_snapshot(table, root, uri, as_of)


def table_snapshot(table, root: str, uri: str, as_of: int | datetime | None) -> TableSnapshot:
    """The data files (relative to ``root``, the table's location) and sizes of the loaded
    pyiceberg ``table`` at its current snapshot or ``as_of``; delete files and data files that
    are not Parquet are refused (UnsupportedTableError naming ``uri``)."""
    from pyiceberg.manifest import FileFormat

    try:
        snapshot = _snapshot(table, as_of, uri)
        tasks = list(table.scan(snapshot_id=snapshot.snapshot_id).plan_files())
    except (OSError, ValueError) as error:
        raise StoreError(
            f"{uri}: the Iceberg table could not be read from {table.metadata_location}: "
            f"{str(error).splitlines()[0]}"
        ) from None
    at = f"snapshot {snapshot.snapshot_id} of this Iceberg table"
    sizes = {}
    for task in tasks:
        if task.delete_files:
            raise UnsupportedTableError(
                f"{uri}: {at} has delete files ({len(task.delete_files)} for "
                f"{task.file.file_path}), which adopt cannot pin as files; rewrite the data files "
                f"(rewrite_data_files / rewrite_position_delete_files) and adopt again"
            )
        if task.file.file_format != FileFormat.PARQUET:
            raise UnsupportedTableError(
                f"{uri}: {at} has a {task.file.file_format.name} data file "
                f"({task.file.file_path}); adopt reads Parquet only"
            )
        sizes[relative_file(root, task.file.file_path, uri)] = task.file.file_size_in_bytes
    if not sizes:
        raise StoreError(f"{uri}: {at} has no data files")
    return TableSnapshot("iceberg", sorted(sizes), sizes, snapshot.snapshot_id)


def _snapshot(table, as_of: int | datetime | None, uri: str):
    if as_of is None:
        found, what = table.current_snapshot(), "current snapshot"
    elif isinstance(as_of, int):
        found, what = table.snapshot_by_id(as_of), f"snapshot {as_of}"
    else:
        found = table.snapshot_as_of_timestamp(int(as_of.timestamp() * 1000))
        what = f"snapshot as of {as_of.isoformat()}"
    if found is None:
        raise StoreError(f"{uri}: the Iceberg table has no {what}")
    return found


def load_catalog_table(
    store: GalleryStore, name: str, catalog_uri: str, warehouse: str | None = None
):
    """The pyiceberg table ``name`` (``namespace.table``) of the SQL catalog at ``catalog_uri``
    (a SQLAlchemy URL), under the catalog name ``raycompat export`` writes (:data:`CATALOG_NAME`).
    The catalog is only read: its tables are never created. StoreError naming the catalog and
    listing what it holds when the namespace or table is missing."""
    require("pyiceberg", "iceberg", "Iceberg")
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
    from sqlalchemy.exc import SQLAlchemyError

    shown = _check_catalog_file(catalog_uri)
    options = {"warehouse": warehouse} if warehouse else {}
    try:
        catalog = SqlCatalog(
            CATALOG_NAME,
            uri=catalog_uri,
            init_catalog_tables="false",
            **options,
            **iceberg_properties(store.storage_options),
        )
        return catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError):
        pass
    except (OSError, ValueError, SQLAlchemyError) as error:
        raise StoreError(
            f"the Iceberg catalog {shown} could not be read for table {name}: "
            f"{str(error).splitlines()[0]}"
        ) from None
    raise _missing(catalog, shown, name)


def _check_catalog_file(catalog_uri: str) -> str:
    """``catalog_uri`` as shown in errors (no password); a SQLite catalog must exist (opening
    a missing one would create an empty database file)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(catalog_uri)
    except ArgumentError:
        raise StoreError(
            f"--catalog-uri {catalog_uri!r} is not a SQLAlchemy URL (sqlite:///path/catalog.db)"
        ) from None
    shown = url.render_as_string(hide_password=True)
    memory = url.database in (None, "", ":memory:")
    if url.get_backend_name() == "sqlite" and not memory and not os.path.isfile(url.database):
        raise StoreError(f"the Iceberg catalog {shown}: no such SQLite file {url.database}")
    return shown


def _missing(catalog, shown: str, name: str) -> StoreError:
    """The error for a table ``name`` the catalog lacks, listing what it holds."""
    namespace = name.rpartition(".")[0]
    spaces = sorted(".".join(n) for n in catalog.list_namespaces())
    where = f"the Iceberg catalog {shown} (catalog name {catalog.name!r})"
    if namespace not in spaces:
        return StoreError(
            f"{where} has no namespace {namespace!r} (for table {name}); its namespaces: "
            f"{', '.join(spaces) or 'none'}"
        )
    tables = sorted(".".join(t) for ns in spaces for t in catalog.list_tables(ns))
    listed = ", ".join(tables[:LISTED])
    if len(tables) > LISTED:
        listed += f" and {len(tables) - LISTED} more"
    return StoreError(f"{where} has no table {name}; its tables: {listed or 'none'}")


def location_uri(location: str) -> str:
    """An Iceberg table's location as ``adopt`` names a table: a local path for ``file:``,
    ``s3://bucket/key`` for ``s3:``, ``s3a:`` and ``s3n:`` (as Spark writes it)."""
    scheme, colon, rest = location.partition(":")
    if not colon or "/" in scheme:
        return location
    if scheme == "file":
        return "/" + rest.lstrip("/")
    return f"s3://{rest.lstrip('/')}" if scheme in ("s3", "s3a", "s3n") else location
