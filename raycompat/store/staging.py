"""Staging and publishing one version: write part files, verify them, then create the record.

Nothing under a staging prefix is visible to readers: they only follow version records, and the
record is created (atomically, create-if-absent) after every part file has been read back and
verified. The prefix is ``<gallery>/_data/<version>/<staging_name>/``; a rerun with the same
``staging_name`` continues in it, and after a successful commit the same files *are* the
version (no copy: S3 has no rename, and a copy of a large version would not be atomic either).
"""

from __future__ import annotations

import dataclasses
import logging

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from raycompat.store.errors import PublishConflictError, StoreError, VerificationError
from raycompat.store.filesystems import Backend
from raycompat.store.manifest import VersionInfo, now_utc, record_path, staging_path
from raycompat.store.parquet import iter_file_batches, open_parquet, write_parquet
from raycompat.store.paths import check_name, join
from raycompat.store.schema import (
    check_unique_ids,
    validate_schema,
    validate_table,
    validate_values,
    version_metadata,
)

logger = logging.getLogger(__name__)


class Staging:
    """Part files of one version being published. Use via ``GalleryStore.begin``.

    Attributes:
        uri: full URI of the staging prefix (``s3://...`` or an absolute local path), where
            external writers (Ray Data ``write_parquet``, pyarrow) may put ``*.parquet`` files.
        filesystem: the pyarrow filesystem for ``path``; path: its filesystem path.
    """

    def __init__(self, backend: Backend, gallery_path: str, info: VersionInfo, staging_name: str):
        self._backend, self._gallery_path = backend, gallery_path
        self.info = dataclasses.replace(info, rows=0, files=[], created="")
        self.filesystem: pafs.FileSystem = backend.filesystem
        self.path = staging_path(gallery_path, info.version, staging_name)
        self.uri = backend.uri(self.path)
        self._record = record_path(gallery_path, info.version)

    def write_table(self, table: pa.Table, name: str) -> str:
        """Validate ``table`` and write it as part file ``name`` (``*.parquet``); return its path.

        Rewriting an existing name replaces that part (useful when a killed job reruns). Once
        the version is published, nothing more is written (published files are immutable).
        """
        if not check_name("part file", name).endswith(".parquet"):
            raise StoreError(f"part file name {name!r} must end with '.parquet'")
        if self._published():
            raise PublishConflictError(f"{self._backend.uri(self._record)} already exists")
        path = join(self.path, name)
        validate_table(table, self.info, self._backend.uri(path))
        meta = {k.decode(): v for k, v in (table.schema.metadata or {}).items()}
        meta.update(version_metadata(self.info))
        write_parquet(table.replace_schema_metadata(meta), self.filesystem, path)
        return path

    def files(self) -> list[str]:
        """Filesystem paths of the complete part files, sorted (``_*``/``.*`` entries skipped)."""
        selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        out = []
        for entry in self.filesystem.get_file_info(selector):
            rel = entry.path[len(self.path) + 1 :]
            hidden = any(s.startswith(("_", ".")) for s in rel.split("/"))
            if entry.type == pafs.FileType.File and rel.endswith(".parquet") and not hidden:
                out.append(entry.path)
        return sorted(out)

    def _published(self) -> bool:
        return self.filesystem.get_file_info(self._record).type != pafs.FileType.NotFound

    def _published_from_here(self) -> bool:
        """True if the version's record lists files of this staging prefix."""
        if not self._published():
            return False
        with self.filesystem.open_input_stream(self._record) as handle:
            info = VersionInfo.from_json(handle.read(), self._backend.uri(self._record))
        prefix = self.path[len(self._gallery_path) + 1 :] + "/"
        return any(f.startswith(prefix) for f in info.files)

    def commit(
        self, expected_rows: int | None = None, expected_ids: pa.Array | None = None
    ) -> VersionInfo:
        """Verify every part file, then publish the version record atomically.

        Checks each file (readable Parquet, schema, width, no null/NaN/inf vectors, norms if
        ``normalized``), ids unique across files, and the total row count and id set against
        ``expected_rows`` / ``expected_ids`` when given.

        Raises:
            PublishConflictError: the version exists, before or after verification (lost race).
        """
        version = self.info.version
        if self._published():
            raise PublishConflictError(f"{self._backend.uri(self._record)} already exists")
        files = self.files()
        if not files:
            raise StoreError(f"{self.uri}: no part files to publish for version {version}")
        ids, rows, first = [], 0, None
        for path in files:
            source = self._backend.uri(path)
            with open_parquet(self.filesystem, path, source) as parquet:
                schema = parquet.schema_arrow
                validate_schema(schema, self.info, source)
                first = first or (source, [(f.name, f.type) for f in schema])
                if [(f.name, f.type) for f in schema] != first[1]:
                    raise StoreError(f"{source}: schema {schema} differs from {first[0]}")
                file_ids = []
                for batch, offset in iter_file_batches(parquet, source):
                    validate_values(batch, self.info, source, offset)
                    file_ids.append(batch.column("id"))
                    rows += batch.num_rows
                empty = pa.array([], type=schema.field("id").type)
                ids.append((source, pa.concat_arrays(file_ids) if file_ids else empty))
        if rows == 0:
            raise StoreError(f"{self.uri}: the part files hold no rows")
        check_unique_ids(ids)
        self._verify(rows, [a for _, a in ids], expected_rows, expected_ids)
        info = dataclasses.replace(
            self.info,
            rows=rows,
            created=now_utc(),
            files=[p[len(self._gallery_path) + 1 :] for p in files],
        )
        try:
            self._backend.create_exclusive(self._record, info.to_json())
        except FileExistsError:
            raise PublishConflictError(
                f"{self._backend.uri(self._record)} was published by another writer first"
            ) from None
        logger.info("published %s (%d rows, %d files)", self._record, rows, len(files))
        return info

    def _verify(self, rows: int, ids: list, expected_rows: int | None, expected_ids) -> None:
        if expected_rows is not None and rows != expected_rows:
            raise VerificationError(f"{self.uri}: staged {rows} rows, expected {expected_rows}")
        if expected_ids is None:
            return
        staged = pa.chunked_array(ids, type=ids[0].type)
        try:
            if isinstance(expected_ids, pa.ChunkedArray):
                expected_ids = expected_ids.combine_chunks()
            expected = pa.array(expected_ids).cast(staged.type)
        except (pa.ArrowException, TypeError) as error:
            raise VerificationError(
                f"{self.uri}: expected_ids cannot be compared with {staged.type} ids ({error})"
            ) from None
        missing = pc.filter(expected, pc.invert(pc.is_in(expected, value_set=staged)))
        extra = pc.filter(staged, pc.invert(pc.is_in(staged, value_set=expected)))
        if len(missing) or len(extra) or len(expected) != len(staged):
            raise VerificationError(
                f"{self.uri}: staged id set differs from expected_ids: {len(missing)} missing "
                f"(e.g. {missing[:3].to_pylist()}), {len(extra)} unexpected "
                f"(e.g. {extra[:3].to_pylist()}), {len(staged)} staged vs {len(expected)} expected"
            )

    def abort(self) -> None:
        """Delete the staging prefix (e.g. after a failure or a lost race).

        Refused when the published version's files live under this prefix.
        """
        if self._published_from_here():
            raise StoreError(f"{self.uri}: version {self.info.version} is published; not deleting")
        if self.filesystem.get_file_info(self.path).type != pafs.FileType.NotFound:
            self.filesystem.delete_dir(self.path)
        logger.info("aborted staging %s", self.uri)
