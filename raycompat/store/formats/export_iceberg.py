"""Writing an exported version as an Iceberg table, through ``pyiceberg`` and a SQL catalog.

The target is ``namespace.table`` in the catalog at ``catalog_uri`` (SQLAlchemy URL; the embedded
default is SQLite, ``sqlite:///path/catalog.db``) whose tables live under ``warehouse`` (a local
folder or s3:// URI). The namespace is created if absent; a table of that name is refused
(Iceberg keeps history, so an export goes to a new table name). The batches stream into one
transaction: one append (pyiceberg microbatches a ``RecordBatchReader`` by target file size, so
memory stays bounded) and the table properties naming the source (``raycompat.source.*``,
``export.py``), committed as one snapshot. Needs the ``iceberg`` extra.

The table's files go to ``warehouse/namespace/table`` (the SQL catalog's own convention, named
explicitly), which must be absent or empty: every file there is then this export's. An export
that fails (a full disk, Ctrl-C, a bad source file) drops the table it created and removes that
folder, so nothing half-written stays in the warehouse and a rerun creates the table again; a
full disk is one line (:class:`~raycompat.store.maintenance.no_space.NoSpaceError`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from raycompat.errors import StoreError
from raycompat.io.filesystems import open_backend
from raycompat.store.formats.adopt_iceberg import CATALOG_NAME, iceberg_properties
from raycompat.store.formats.export import check_outside_store, remove_target
from raycompat.store.formats.snapshot import require
from raycompat.store.maintenance.no_space import NoSpaceError, no_space_left

if TYPE_CHECKING:
    from raycompat.store.gallery import GalleryStore


def write(
    reader: pa.RecordBatchReader,
    target: str,
    properties: Callable[[], dict[str, str]],
    storage_options: dict | None,
    store: GalleryStore,
    *,
    catalog_uri: str,
    warehouse: str,
) -> int:
    """Create the Iceberg table ``target`` (``namespace.table``) holding ``reader``'s rows;
    the number of data files written."""
    require("pyiceberg", "iceberg", "Iceberg", use="exporting")
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import TableAlreadyExistsError
    from sqlalchemy.exc import SQLAlchemyError

    namespace, dot, name = target.rpartition(".")
    if not dot or not namespace:
        raise StoreError(f"Iceberg table {target!r} must be named namespace.table")
    check_outside_store(store, warehouse, "the Iceberg warehouse")
    if "://" not in warehouse:
        warehouse = os.path.abspath(warehouse)
    location = f"{warehouse.rstrip('/')}/{namespace}/{name}"
    try:
        catalog = SqlCatalog(
            CATALOG_NAME,
            uri=catalog_uri,
            warehouse=warehouse,
            **iceberg_properties(storage_options),
        )
        if catalog.table_exists(target):
            raise TableAlreadyExistsError(target)
        _check_location(target, location, storage_options)
        catalog.create_namespace_if_not_exists(namespace)
        table = catalog.create_table(target, schema=reader.schema, location=location)
    except TableAlreadyExistsError:
        raise StoreError(
            f"the catalog {catalog_uri} already has the table {target}; export to a new table name"
        ) from None
    except StoreError:  # _check_location's refusal, as it is (a StoreError is a ValueError)
        raise
    except (OSError, ValueError, SQLAlchemyError) as error:
        raise StoreError(
            f"{catalog_uri}: the Iceberg table {target} could not be created: "
            f"{str(error).splitlines()[0]}"
        ) from None
    try:
        with table.transaction() as commit:
            commit.append(reader)
            commit.set_properties(properties())
    except BaseException as error:  # Ctrl-C too: a rerun must find no table and no files
        catalog.drop_table(target)
        removed = remove_target(location, storage_options)
        if no_space_left(error):
            also = "; the files this export wrote were removed" if removed else ""
            raise NoSpaceError(
                f"{target}: no space left on device; the Iceberg table was not written{also}"
            ) from None
        raise
    return int(table.current_snapshot().summary["added-data-files"])


def _check_location(target: str, location: str, storage_options: dict | None) -> None:
    """Refuse a table folder that holds files already (another table's, or what a tool that
    dropped a table without purging left): an export removes its folder when it fails."""
    backend = open_backend(location, storage_options)
    selector = pafs.FileSelector(backend.root, allow_not_found=True, recursive=True)
    found = [e for e in backend.filesystem.get_file_info(selector) if e.type == pafs.FileType.File]
    if found:
        raise StoreError(
            f"{location} (the folder of the Iceberg table {target}) already holds "
            f"{len(found)} files; export to a new table name or empty that folder"
        )
