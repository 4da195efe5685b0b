"""``GalleryStore``: versioned embedding galleries on local disk or S3.

    store = GalleryStore("s3://bucket/prefix", storage_options={...})
    staging = store.begin("faces", VersionInfo("v2", "resnet50-e90", 2048, True, "v2 = h_2(v1)"))
    staging.write_table(table, "part-00000.parquet")   # or Ray Data write_parquet(staging.uri)
    staging.commit(expected_rows=len(table))
    store.read("faces", "v2")

Every read is validated against the version record (schema, width, NaN/inf, norms, duplicate ids,
row count), and every error names the file and row. See ``docs/store.md`` for the layout and the
publishing protocol.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from raycompat.errors import (
    ManifestError,
    MissingStoreError,
    PublishConflictError,
    SchemaError,
    StoreError,
)
from raycompat.io.credentials import drop_redacted, register_secrets
from raycompat.io.filesystems import Backend, open_backend
from raycompat.store.commit.lease import DEFAULT_TIMEOUT_S, Lease, LeaseOwner
from raycompat.store.commit.staging import Staging
from raycompat.store.formats.external import open_adopted
from raycompat.store.formats.external import root_path as external_root
from raycompat.store.maintenance.marker import ensure_marker, read_marker, register_gallery
from raycompat.store.maintenance.retention import (
    DEFAULT_RETENTION_S,
    check_retention,
    commit_horizon,
)
from raycompat.store.manifest import VERSIONS_DIR, VersionInfo, record_path
from raycompat.store.paths import SAFE_NAME, check_name, check_relative_path, join
from raycompat.store.read.parquet import iter_file_batches, open_parquet, read_file
from raycompat.store.schema import check_unique_ids, validate_schema, validate_values


class GalleryStore:
    """A store root holding galleries, each a sequence of immutable, validated versions.

    Args:
        root: ``"s3://bucket/prefix"`` or a local directory.
        storage_options: s3fs options (``{"client_kwargs": {"endpoint_url": ...}}``, ``key``...).
        bulk_io: Parquet I/O on S3 through ``"native"`` pyarrow, ``"fsspec"`` (s3fs) or
            ``"auto"`` (native when the options translate, see ``filesystems.py``).
        lease_timeout_s: a staging area whose writer has not heartbeat for this long may be
            taken over by ``begin`` (see ``lease.py``).
        retention_s: the retention of a store this object creates (written into its marker
            by the first write; default 7 days, at least 4 lease timeouts): gc deletes nothing
            younger and writers commit nothing older than half of it (``retention.py``). An
            existing store keeps the retention its marker records (:attr:`retention_s`).
    """

    def __init__(
        self,
        root: str,
        storage_options: dict | None = None,
        *,
        bulk_io: str = "auto",
        lease_timeout_s: float = DEFAULT_TIMEOUT_S,
        retention_s: float = DEFAULT_RETENTION_S,
    ):
        if not (isinstance(lease_timeout_s, int | float) and lease_timeout_s > 0):
            raise StoreError(f"lease_timeout_s must be a number > 0, got {lease_timeout_s!r}")
        self.lease_timeout_s = float(lease_timeout_s)
        self._new_retention_s = check_retention(retention_s, self.lease_timeout_s)
        self._retention_s: float | None = None  # the marker's, once read
        # A config written by a job carries its credentials as "<redacted>": those entries
        # are dropped, so a rerun takes credentials from the environment or instance role.
        storage_options = drop_redacted(storage_options)
        register_secrets(storage_options)  # scrubbed from every log line from now on
        self.root, self.storage_options, self.bulk_io = root, storage_options, bulk_io
        self._backend = open_backend(root, storage_options, bulk_io)

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self._backend.filesystem

    @property
    def backend(self) -> Backend:
        """The filesystem backend (bulk filesystem, atomic record writes); used by ``index``."""
        return self._backend

    def path(self, *parts: str) -> str:
        """Filesystem path of ``parts`` under the root (refuses ``..``, absolute parts, ...)."""
        if not parts:
            return self._backend.root
        return join(self._backend.root, check_relative_path("/".join(parts), "store.path()"))

    def uri(self, *parts: str) -> str:
        return self._backend.uri(self.path(*parts))

    def mark(self) -> bool:
        """Mark the root as a raycompat store (``marker.py``) unless it is marked; True when
        this call wrote the marker. Every writer calls it before its first write."""
        return ensure_marker(self._backend, self._new_retention_s)

    def register(self, gallery: str) -> None:
        """Mark the store and record ``gallery`` as one it created (gc manages only those);
        every writer of a gallery's files calls it first."""
        self.mark()
        register_gallery(self._backend, gallery)

    @property
    def retention_s(self) -> float:
        """The store's retention (its marker's; ``retention.py``), or the retention a new
        store will get when it is not marked yet."""
        if self._retention_s is None:
            marker = read_marker(self._backend)
            if marker is None:
                return self._new_retention_s
            self._retention_s = marker.retention_s
        return self._retention_s

    def galleries(self) -> list[str]:
        """Names of the galleries with at least one published version, sorted."""
        selector = pafs.FileSelector(self._backend.root, allow_not_found=True)
        names = [
            e.base_name
            for e in self.filesystem.get_file_info(selector)
            if e.type == pafs.FileType.Directory and SAFE_NAME.fullmatch(e.base_name)
        ]
        return [g for g in sorted(names) if self._record_paths(g)]

    def _record_paths(self, gallery: str) -> list[str]:
        selector = pafs.FileSelector(
            self.path(check_name("gallery", gallery), VERSIONS_DIR), allow_not_found=True
        )
        return [
            e.path
            for e in self.filesystem.get_file_info(selector)
            if e.type == pafs.FileType.File
            and e.base_name.endswith(".json")
            and SAFE_NAME.fullmatch(e.base_name)
        ]

    def versions(self, gallery: str) -> list[VersionInfo]:
        """Published versions, oldest first (by ``created``, then name).

        Raises:
            StoreError: a record is corrupt (``CorruptFileError`` naming the file and the key);
                :meth:`versions_report` lists the readable ones instead.
        """
        infos = [self.version(gallery, _record_name(p)) for p in self._record_paths(gallery)]
        return sorted(infos, key=lambda i: (i.created, i.version))

    def versions_report(self, gallery: str) -> tuple[list[VersionInfo], list[tuple[str, str]]]:
        """The readable versions (as :meth:`versions`) and ``(uri, error)`` for each record
        that cannot be read, so one corrupt record does not hide the rest of a gallery."""
        infos, corrupt = [], []
        for path in self._record_paths(gallery):
            try:
                infos.append(self.version(gallery, _record_name(path)))
            except StoreError as error:
                corrupt.append((self._backend.uri(path), str(error)))
        return sorted(infos, key=lambda i: (i.created, i.version)), corrupt

    def exists(self) -> bool:
        """Whether there is a store at the root: a local folder, or an S3 prefix holding at
        least one object (S3 has no empty folders). ``GalleryStore(...)`` does not require it:
        a new store exists from its first write on."""
        return self.filesystem.get_file_info(self._backend.root).type == pafs.FileType.Directory

    def check_exists(self) -> None:
        """Raise :class:`MissingStoreError` unless :meth:`exists` (for readers: a mistyped root
        must not read as an empty store)."""
        if not self.exists():
            local = self._backend.scheme == "file"
            if self.filesystem.get_file_info(self._backend.root).type == pafs.FileType.File:
                why = "it is a file, not a folder" if local else "it is an object, not a prefix"
            else:
                why = "the folder does not exist" if local else "no object under that prefix"
            raise MissingStoreError(f"no store at {self._backend.uri(self._backend.root)}: {why}")

    def latest(self, gallery: str) -> VersionInfo | None:
        versions = self.versions(gallery)
        return versions[-1] if versions else None

    def version(self, gallery: str, v: str) -> VersionInfo:
        path = record_path(self.path(check_name("gallery", gallery)), v)
        source = self._backend.uri(path)
        try:
            with self.filesystem.open_input_stream(path) as handle:
                info = VersionInfo.from_json(handle.read(), source)
        except FileNotFoundError:
            known = sorted(_record_name(p) for p in self._record_paths(gallery))
            raise ManifestError(
                f"gallery {gallery!r} has no version {v!r}; it has {known}"
            ) from None
        if info.version != v:
            raise ManifestError(f"{source}: record is for version {info.version!r}, not {v!r}")
        return info

    def read(self, gallery: str, version: str, columns: list[str] | None = None) -> pa.Table:
        """The whole version as one table, validated (see the module docstring)."""
        info, tables, ids, first = self.version(gallery, version), [], [], []
        for path, source in self.version_files(gallery, info):
            with self.open_file(info, path, source) as parquet:
                self._check_file_schema(parquet.schema_arrow, info, source, columns, first)
                table = read_file(parquet, source, columns)
            validate_values(table, info, source)
            tables.append(table)
            if "id" in table.column_names:
                ids.append((source, table.column("id").combine_chunks()))
        check_unique_ids(ids)
        self._check_rows(info, sum(t.num_rows for t in tables), gallery)
        return pa.concat_tables(tables)

    def iter_batches(
        self, gallery: str, version: str, batch_size: int = 65536, columns: list[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream the version file by file, one validated batch at a time (bounded memory).

        Ids are checked unique within each batch; uniqueness across the version was checked on
        publish (``read`` re-checks it).
        """
        info, rows, first = self.version(gallery, version), 0, []
        for path, source in self.version_files(gallery, info):
            with self.open_file(info, path, source) as parquet:
                self._check_file_schema(parquet.schema_arrow, info, source, columns, first)
                for batch, offset in iter_file_batches(parquet, source, batch_size, columns):
                    validate_values(batch, info, source, offset)
                    rows += batch.num_rows
                    yield batch
        self._check_rows(info, rows, gallery)

    def begin(
        self,
        gallery: str,
        info: VersionInfo,
        staging_name: str | None = None,
        *,
        lease_timeout_s: float | None = None,
        owner: LeaseOwner | None = None,
    ) -> Staging:
        """Start publishing ``info.version`` and take the staging area's lease.

        The same ``staging_name`` resumes the same prefix: the complete parts earlier writers
        left there are adopted onto this writer's list by their records (never rewritten), unless
        an abort withdrew them or they are older than the commit horizon (``retention.py``).
        Nothing of theirs is deleted (temporary files are gc's).

        Args:
            lease_timeout_s: a lease whose heartbeat is older than this may be taken over
                (default ``self.lease_timeout_s``).
            owner: who takes the lease (default: this process, its host and Ray job id).
        Raises:
            PublishConflictError: the version is already published.
            LeaseHeldError: a live writer holds the staging area (named in the message).
        """
        if not isinstance(info, VersionInfo):
            raise StoreError(f"begin() needs a VersionInfo, got {type(info).__name__}")
        gallery_path = self.path(check_name("gallery", gallery))
        staging = Staging(self._backend, gallery_path, info, staging_name or uuid.uuid4().hex)
        if staging._published():
            raise PublishConflictError(f"gallery {gallery!r} already has version {info.version!r}")
        timeout = self.lease_timeout_s if lease_timeout_s is None else lease_timeout_s
        check_retention(self.retention_s, timeout)  # the store's, against this writer's lease
        self.register(gallery)
        staging.horizon_s = commit_horizon(self.retention_s)
        staging.lease = Lease.acquire(self._backend, staging.lease_dir, timeout, owner)
        if staging._published():  # published between the check and the lease: write nothing
            staging.lease.stop()
            raise PublishConflictError(f"gallery {gallery!r} already has version {info.version!r}")
        staging.resume()  # earlier writers' complete parts, adopted by their records
        return staging

    def version_files(self, gallery: str, info: VersionInfo) -> Iterator[tuple[str, str]]:
        """``(filesystem path, URI)`` of each file of the version, in record order. An adopted
        version's files lie outside the store, under its ``external`` root."""
        if info.external is None:
            paths = [self.path(gallery, rel) for rel in info.files]
        else:
            record = self.uri(gallery, VERSIONS_DIR, f"{info.version}.json")
            base = external_root(self._backend, info.external, record)
            paths = [join(base, rel) for rel in info.files]
        for path in paths:
            yield path, self._backend.uri(path)

    def open_file(self, info: VersionInfo, path: str, source: str):
        """Open a file of ``info`` (a path from :meth:`version_files`) as a context manager
        giving a ``pq.ParquetFile``: the one place version files are opened. A file the store
        wrote must have the byte size its version record gives it (``ChangedFileError``); a
        file of an adopted version is first checked against its pin (``ChangedFileError``
        when it changed or vanished) and read in store columns (``formats/external.py``)."""
        if info.external is None:
            rel = path[len(self._backend.root) + 1 :].split("/", 1)[-1]
            return open_parquet(self.filesystem, path, source, info.file_sizes().get(rel))
        return open_adopted(self._backend, info, path, source)

    @staticmethod
    def _check_file_schema(
        schema: pa.Schema, info: VersionInfo, source: str, columns: list | None, first: list
    ) -> None:
        """Validate one file's schema; ``first`` holds the first file's ``(name, type)`` list."""
        validate_schema(schema, info, source)
        unknown = sorted(set(columns or []) - set(schema.names))
        if unknown:
            raise SchemaError(f"{source}: no column(s) {unknown}; columns are {schema.names}")
        picked = [(n, schema.field(n).type) for n in (columns or schema.names)]
        if first and picked != first:
            raise SchemaError(f"{source}: columns {picked} differ from the version's first file")
        first[:] = first or picked

    def _check_rows(self, info: VersionInfo, rows: int, gallery: str) -> None:
        if rows != info.rows:
            raise ManifestError(
                f"{self.uri(gallery, VERSIONS_DIR, info.version + '.json')}: record says "
                f"{info.rows} rows, its files hold {rows}"
            )


def _record_name(path: str) -> str:
    """``.../_versions/v3.json`` -> ``"v3"``."""
    return path.rsplit("/", 1)[1][: -len(".json")]
