"""A Delta Lake table's snapshot, read through ``deltalake`` (delta-rs), for ``adopt``.

The snapshot's data files are its log's add actions (path, size) at the current version or at
``--as-of`` (a version number or a timestamp), never a folder listing: after a delete, an
overwrite or a compaction the superseded files stay in the folder until a vacuum. ``adopt``
pins exactly these files, so a later vacuum or compaction of the source is a ChangedFileError
on read, like any changed pinned file. Refused, with one line naming the table: deletion vectors
(rows deleted without rewriting their file: the file alone would resurrect them) and column
mapping (the files' column names are not the table's). Needs the ``delta`` extra.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pyarrow as pa

from raycompat.errors import StoreError
from raycompat.store.formats.snapshot import (
    TableSnapshot,
    UnsupportedTableError,
    relative_file,
    require,
)

if TYPE_CHECKING:
    from raycompat.store.gallery import GalleryStore

S3FS_TO_DELTA = {
    "key": "AWS_ACCESS_KEY_ID",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "token": "AWS_SESSION_TOKEN",
}


def delta_storage_options(options: dict | None) -> dict[str, str]:
    """deltalake's S3 options (object_store's ``AWS_*`` keys) for the store's s3fs
    ``storage_options``: credentials, endpoint (plain HTTP allowed for an ``http://`` one),
    region, anonymous access. What is absent comes from the environment, as for s3fs."""
    options = options or {}
    client = options.get("client_kwargs") or {}
    out = {delta: str(options[s3fs]) for s3fs, delta in S3FS_TO_DELTA.items() if options.get(s3fs)}
    endpoint = client.get("endpoint_url") or options.get("endpoint_url")
    if endpoint:
        out["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    if client.get("region_name"):
        out["AWS_REGION"] = client["region_name"]
    if options.get("anon"):
        out["AWS_SKIP_SIGNATURE"] = "true"
    return out


def read_snapshot(
    store: GalleryStore, root: str, uri: str, as_of: int | datetime | None
) -> TableSnapshot:
    """The data files (relative to ``root``) and their sizes of the Delta table at ``uri``,
    at its current version or ``as_of``; StoreError if it cannot be read at that version."""
    deltalake = require("deltalake", "delta", "Delta")
    s3 = store.backend.scheme == "s3"
    at = "" if as_of is None else f" as of {as_of}"
    try:
        table = deltalake.DeltaTable(
            store.backend.uri(root),
            storage_options=delta_storage_options(store.storage_options) if s3 else None,
        )
        if as_of is not None:
            table.load_as_version(as_of)
        _refuse_features(table, uri)
        actions = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"])
    except deltalake.exceptions.DeltaError as error:
        raise StoreError(
            f"{uri}: the Delta table could not be read{at}: {str(error).splitlines()[0]}"
        ) from None
    table_uri = store.backend.uri(root)
    sizes = {
        relative_file(root, _data_file(table_uri, row["path"]), uri): row["size_bytes"]
        for row in actions.to_pylist()
    }
    if not sizes:
        raise StoreError(f"{uri}: version {table.version()} of the Delta table has no data files")
    return TableSnapshot("delta", sorted(sizes), sizes, table.version())


def _data_file(table_uri: str, path: str) -> str:
    """The URI of an add action's ``path``: URL-encoded in the log, relative to the table's
    root unless absolute (a shallow clone's files)."""
    path = unquote(path)
    absolute = path.startswith("/") or ":" in path.split("/", 1)[0]
    return path if absolute else f"{table_uri}/{path}"


def _refuse_features(table, uri: str) -> None:
    """Refuse column mapping and any deletion vector in the loaded version."""
    version = table.version()
    mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mapping != "none":
        raise UnsupportedTableError(
            f"{uri}: version {version} of this Delta table uses column mapping ({mapping}), so "
            f"its files' column names are not the table's; adopt cannot read them as files"
        )
    if "deletionVectors" not in (table.protocol().reader_features or []):
        return
    for batch in pa.RecordBatchReader.from_stream(table.deletion_vectors()):
        if batch.num_rows:
            raise UnsupportedTableError(
                f"{uri}: version {version} of this Delta table has deletion vectors (rows "
                f"deleted without rewriting their file, e.g. {batch.column('filepath')[0]}), "
                f"which adopt cannot pin as files; purge them (REORG TABLE ... APPLY (PURGE)) "
                f"and adopt again"
            )
