"""Writing an exported version as an Iceberg table, through ``pyiceberg`` and a SQL catalog.

The target is ``namespace.table`` in the catalog at ``catalog_uri`` (SQLAlchemy URL; the embedded
default is SQLite, ``sqlite:///path/catalog.db``) whose tables live under ``warehouse`` (a local
folder or s3:// URI). The namespace is created if absent; a table of that name is refused
(Iceberg keeps history, so an export goes to a new table name). The batches stream into one
transaction: one append (pyiceberg microbatches a ``RecordBatchReader`` by target file size, so
memory stays bounded) and the table properties naming the source (``raycompat.source.*``,
``export.py``), committed as one snapshot. Needs the ``iceberg`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from raycompat.errors import StoreError
from raycompat.store.formats.adopt_iceberg import CATALOG_NAME, iceberg_properties
from raycompat.store.formats.export import check_outside_store
from raycompat.store.formats.snapshot import require

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

    namespace, dot, _ = target.rpartition(".")
    if not dot or not namespace:
        raise StoreError(f"Iceberg table {target!r} must be named namespace.table")
    check_outside_store(store, warehouse, "the Iceberg warehouse")
    if "://" not in warehouse:
        warehouse = os.path.abspath(warehouse)
    try:
        catalog = SqlCatalog(
            CATALOG_NAME,
            uri=catalog_uri,
            warehouse=warehouse,
            **iceberg_properties(storage_options),
        )
        catalog.create_namespace_if_not_exists(namespace)
        table = catalog.create_table(target, schema=reader.schema)
    except TableAlreadyExistsError:
        raise StoreError(
            f"the catalog {catalog_uri} already has the table {target}; export to a new table name"
        ) from None
    except (OSError, ValueError, SQLAlchemyError) as error:
        raise StoreError(
            f"{catalog_uri}: the Iceberg table {target} could not be created: "
            f"{str(error).splitlines()[0]}"
        ) from None
    try:
        with table.transaction() as commit:
            commit.append(reader)
            commit.set_properties(properties())
    except BaseException:  # the table this call created holds nothing: a rerun may create it
        catalog.drop_table(target)
        raise
    return int(table.current_snapshot().summary["added-data-files"])
