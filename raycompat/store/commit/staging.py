"""Staging and publishing one version: write part files, verify them, then create the record.

Nothing under a staging prefix is visible to readers: they only follow version records, and the
record is created (atomically, create-if-absent) after every part file has been read back and
verified. The prefix is ``<gallery>/_data/<version>/<staging_name>/``; a rerun with the same
``staging_name`` continues in it, and after a successful commit the same files *are* the
version (no copy: S3 has no rename, and a copy of a large version would not be atomic either).

One writer at a time: ``GalleryStore.begin`` takes the prefix's lease (``lease.py``), and every
part is written under a per-attempt temporary name, then published (its part record created,
then the file moved into place) only after checking that the lease is still this writer's and
the version is unpublished.

Writer isolation: a part's file gets a name unique to the writer attempt
(``part_record.part_file_name``) and its record is created with create-if-absent, so no writer
ever replaces a file another wrote. Each writer keeps its own list of the parts it publishes:
those it wrote (``publish_part``; a pipeline's driver adds its workers' records with
``add_part``) and those it adopted from earlier writers' complete parts on resume
(``complete_parts`` + ``add_part``). ``commit`` publishes exactly that list, after checking
every listed file is present with its recorded size (a missing one is an error, never a smaller
version) and against its record (``checks.py``). Files in the prefix that are not on the
list (a stalled writer's, a replaced attempt's) are never read.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raycompat.errors import PublishConflictError, StoreError
from raycompat.io.filesystems import Backend
from raycompat.store.commit.checks import (
    RECORD_READERS,
    check_expected,
    check_present,
    check_young,
    scan_rows,
    sum_records,
    written_at,
)
from raycompat.store.commit.lease import LEASE_DIR, Lease, LeaseRef, aborted_through
from raycompat.store.commit.part_record import (
    INTENT_DIR,
    PARTS_DIR,
    HashingSink,
    IdFingerprint,
    IdStats,
    PartRecord,
    part_file_name,
    part_record_path,
)
from raycompat.store.commit.publish import publish_record
from raycompat.store.maintenance.retention import DEFAULT_RETENTION_S, commit_horizon
from raycompat.store.manifest import VersionInfo, now_utc, record_path, staging_path
from raycompat.store.paths import check_name, join
from raycompat.store.read.parquet import dictionary_columns, group_rows
from raycompat.store.schema import cast_embeddings, validate_table, version_metadata

logger = logging.getLogger(__name__)


class Staging:
    """Part files of one version being published. Use via ``GalleryStore.begin``.

    Attributes:
        uri: full URI of the staging prefix (``s3://...`` or an absolute local path).
        filesystem: the pyarrow filesystem for ``path``; path: its filesystem path.
        lease: the held :class:`Lease` (driver) or a :class:`LeaseRef` to check (workers).
    """

    def __init__(
        self,
        backend: Backend,
        gallery_path: str,
        info: VersionInfo,
        staging_name: str,
        lease: Lease | LeaseRef | None = None,
    ):
        self._backend, self._gallery_path = backend, gallery_path
        self.info = dataclasses.replace(
            info, rows=0, files=[], created="", ids=None, file_info=None
        )
        self.filesystem: pafs.FileSystem = backend.filesystem
        self.path = staging_path(gallery_path, info.version, staging_name)
        self.uri = backend.uri(self.path)
        self.lease_dir = join(self.path, LEASE_DIR)
        self.lease = lease
        self._record = record_path(gallery_path, info.version)
        self._parts: dict[str, PartRecord] = {}  # part name -> its file's record (this writer's)
        self._aborted = False  # abort() released the lease as aborted
        self._withdrawn = 0  # parts of lease generations up to this one were aborted
        # the oldest a part file may be to be adopted or committed (``retention.py``);
        # ``GalleryStore.begin`` sets it from the store's retention
        self.horizon_s = commit_horizon(DEFAULT_RETENTION_S)

    @property
    def lease_ref(self) -> LeaseRef:
        """The picklable lease reference to hand to workers that write parts."""
        if self.lease is None:
            raise StoreError(f"{self.uri}: no lease; open staging areas with GalleryStore.begin")
        return self.lease.ref if isinstance(self.lease, Lease) else self.lease

    def check_writable(self, what: str) -> None:
        """Raise unless this writer may still change the staging area: version unpublished
        (``PublishConflictError``) and lease live and ours (``LeaseLostError``)."""
        if self._published():
            raise PublishConflictError(
                f"{self._backend.uri(self._record)} already exists; refusing to {what}"
            )
        self._check_lease(what)

    def _check_lease(self, what: str) -> None:
        """The held lease's own check on the driver (it knows when it was lost), the shared
        record's on workers."""
        if isinstance(self.lease, Lease):
            self.lease.check(what)
        else:
            self.lease_ref.check(self._backend, what)

    def tmp_path(self, name: str) -> str:
        """A fresh per-attempt temporary path for part ``name`` (under ``_tmp/``, ignored)."""
        tmp = join(self.path, "_tmp", f"{name}.{uuid.uuid4().hex}")
        if self.filesystem.type_name == "local":
            self.filesystem.create_dir(join(self.path, "_tmp"), recursive=True)
        return tmp

    def publish_part(
        self,
        tmp: str,
        name: str,
        stats: IdStats,
        rows: int,
        sink: HashingSink,
        input_ids: IdFingerprint | None = None,
        extra: dict | None = None,
    ) -> PartRecord:
        """Move the finished file ``tmp`` into place as a new file of part ``name``; return
        its record (also added to this writer's list of parts).

        Checks the lease and that the version is unpublished, then creates the part record
        (rows, byte size and sha256 from ``sink``, id fingerprint, ``input_ids``, the
        fingerprint of the input rows when the part maps them 1:1, and ``extra``) under the
        file's writer-unique name, and moves the file there: a rename locally, a server-side
        copy on S3. On any failure the temporary file is deleted.
        """
        check_name("part file", name)
        try:
            self.check_writable(f"publish part {name}")
            ref = self.lease_ref
            record = PartRecord(
                part=name,
                file=part_file_name(name, ref.generation),
                rows=rows,
                bytes=sink.bytes,
                sha256=sink.sha256,
                ids=stats.fingerprint,
                min_id=stats.min_id,
                max_id=stats.max_id,
                null_ids=stats.null_ids,
                lease=ref.stamp(),
                written=now_utc(),
                input_ids=input_ids,
                extra=dict(extra or {}),
            )
            path = join(self.path, record.file)
            self._durable(tmp)  # the data before the record that vouches for it
            record_file = part_record_path(self.path, record.file)
            self._backend.create_exclusive(record_file, record.to_json())
            self.filesystem.move(tmp, path)
            self._durable(posixpath.dirname(path))  # the rename itself
        except OSError as error:
            self._quietly_drop_tmp(tmp)
            raise self._changed_under_us(f"publish part {name}", error) from None
        except BaseException:
            self._quietly_drop_tmp(tmp)
            raise
        self._parts[name] = record
        return record

    def open_part(self, name: str) -> tuple[str, HashingSink]:
        """A fresh temporary path for part ``name`` and a hashing sink writing to it."""
        tmp = self.tmp_path(name)
        return tmp, HashingSink(self.filesystem.open_output_stream(tmp))

    def add_part(self, record: PartRecord) -> None:
        """Put a part on this writer's list: one a worker published for it, or an earlier
        writer's complete part adopted on resume. Replaces an earlier entry of the same part."""
        self._parts[check_name("part file", record.part)] = record

    def drop_part(self, name: str) -> None:
        """Take part ``name`` off this writer's list (its file stays; it will not be published)."""
        self._parts.pop(name, None)

    def resume(self) -> int:
        """Adopt the complete parts found in the prefix (``complete_parts``) onto this writer's
        list; returns how many. ``GalleryStore.begin`` calls it."""
        for record in self.complete_parts().values():
            self.add_part(record)
        return len(self._parts)

    def parts(self) -> list[PartRecord]:
        """This writer's parts, by part name: exactly what ``commit`` publishes."""
        return [self._parts[name] for name in sorted(self._parts)]

    def _durable(self, path: str) -> None:
        """fsync a local file or folder, so that a crash cannot leave the version's fsynced
        record pointing at a part whose bytes were still in the page cache. On S3 a completed
        upload is durable; nothing to do."""
        if self._backend.scheme != "file":
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_meta(self, name: str, data: bytes) -> None:
        """Create the small metadata file ``<staging>/<name>`` once (``name`` starts with ``_``,
        so listings ignore it), while the lease is ours and the version unpublished. Like every
        file, it is never replaced: a rerun that writes the same bytes again is a no-op, other
        bytes are a ``StoreError``."""
        if not name.startswith("_"):
            raise StoreError(f"metadata file name {name!r} must start with '_'")
        self.check_writable(f"write {name}")
        path = self.meta_path(name)
        try:
            self._backend.create_exclusive(path, data)
        except FileExistsError:
            with self.filesystem.open_input_stream(path) as handle:
                if handle.read() != data:
                    raise StoreError(
                        f"{self._backend.uri(path)} already exists with other content; abort "
                        f"this staging area to start over"
                    ) from None

    def meta_path(self, name: str) -> str:
        """Where metadata file ``name`` of this writer's run lives: ``<staging>/<name>``, or,
        once a writer aborted the area, ``<staging>/_meta-g<n>/<name>`` (``n``: the newest
        aborted generation), so a rerun after an abort plans afresh while the aborted run's
        files stay untouched until gc."""
        if not self._withdrawn:
            return join(self.path, name)
        return join(self.path, f"_meta-g{self._withdrawn}", name)

    def drop_tmp(self, tmp: str) -> None:
        if self.filesystem.get_file_info(tmp).type != pafs.FileType.NotFound:
            self.filesystem.delete_file(tmp)

    def _quietly_drop_tmp(self, tmp: str) -> None:
        """Drop this writer's temporary file on the way out of a failure; one that cannot be
        dropped is left for gc rather than hiding the failure."""
        try:
            self.drop_tmp(tmp)
        except OSError as error:
            logger.warning("%s: temporary file left for gc: %s", self.uri_of(tmp), error)

    def _changed_under_us(self, what: str, error: OSError) -> StoreError:
        """The one-line error for a storage call that failed because the staging area changed
        under this writer (a file gone, a rename or copy that found no source)."""
        return StoreError(
            f"{self.uri}: version {self.info.version}: could not {what} ({type(error).__name__}: "
            f"{' '.join(str(error).split())}); the staging area changed under this writer (gc "
            f"or another writer); nothing was published, rerun the job to resume"
        )

    def write_table(self, table: pa.Table, name: str, row_group_size: int | None = None) -> str:
        """Validate ``table`` and write it as part ``name`` (``*.parquet``); return the path
        of its file (a name unique to this write, see ``part_record.part_file_name``).

        Writing a name again makes a new file for that part; the version will hold the last
        one. Once the version is published, nothing more is written.
        ``row_group_size`` defaults to about 64 MB of rows.
        """
        if not check_name("part file", name).endswith(".parquet"):
            raise StoreError(f"part file name {name!r} must end with '.parquet'")
        self.check_writable(f"write part {name}")
        table = cast_embeddings(table, self.info)
        validate_table(table, self.info, self._backend.uri(join(self.path, name)))
        meta = {k.decode(): v for k, v in (table.schema.metadata or {}).items()}
        meta.update(version_metadata(self.info))
        stats = IdStats()
        stats.update(table.column("id"))
        tmp, sink = self.open_part(name)
        try:
            pq.write_table(
                table.replace_schema_metadata(meta),
                sink,
                write_page_checksum=True,
                use_dictionary=dictionary_columns(table.schema),
                row_group_size=row_group_size or group_rows(table),
            )
            sink.close()
        except BaseException:
            sink.close()
            self.drop_tmp(tmp)
            raise
        record = self.publish_part(tmp, name, stats, table.num_rows, sink)
        return join(self.path, record.file)

    def files(self) -> list[str]:
        """Filesystem paths of this writer's part files, by part name (what commit publishes)."""
        return [join(self.path, record.file) for record in self.parts()]

    def present(self) -> dict[str, tuple[int, float | None]]:
        """``path -> (byte size, modification time or None where the filesystem gives none)``
        of every complete part file in the prefix, whoever wrote it (one listing; ``_*``/``.*``
        entries skipped)."""
        selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        out = {}
        for entry in self.filesystem.get_file_info(selector):
            rel = entry.path[len(self.path) + 1 :]
            hidden = any(s.startswith(("_", ".")) for s in rel.split("/"))
            if entry.type == pafs.FileType.File and rel.endswith(".parquet") and not hidden:
                out[entry.path] = (entry.size, entry.mtime.timestamp() if entry.mtime else None)
        return dict(sorted(out.items()))

    def complete_parts(self) -> dict[str, PartRecord]:
        """Part name -> the record of one complete file of it in the prefix, any writer's: its
        file present with the recorded size, younger than the commit horizon (an older one may
        be gc's to delete, ``retention.py``), and written by a generation newer than the last
        aborted one. Of several, the newest generation's (then the first by name). O(parts)
        small reads; for resuming (``add_part`` what to keep)."""
        self._withdrawn = aborted_through(self._backend, self.lease_dir)
        oldest, present = time.time() - self.horizon_s, self.present()
        selector = pafs.FileSelector(join(self.path, PARTS_DIR), allow_not_found=True)
        paths = [
            e.path for e in self.filesystem.get_file_info(selector) if e.path.endswith(".json")
        ]
        with ThreadPoolExecutor(RECORD_READERS) as pool:
            records = list(pool.map(self._read_record, paths))
        best: dict[str, PartRecord] = {}
        for record in sorted(records, key=lambda r: (r.part, -r.generation, r.file)):
            size, mtime = present.get(join(self.path, record.file), (None, None))
            if record.generation <= self._withdrawn or written_at(record, mtime) < oldest:
                continue
            if record.part not in best and size == record.bytes:
                best[record.part] = record
        return best

    def _read_record(self, path: str) -> PartRecord:
        with self.filesystem.open_input_stream(path) as handle:
            return PartRecord.from_json(handle.read(), self._backend.uri(path))

    def uri_of(self, path: str) -> str:
        """The URI of a filesystem path under this staging area (named in errors)."""
        return self._backend.uri(path)

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
        self,
        expected_rows: int | None = None,
        expected_ids: pa.Array | IdFingerprint | None = None,
        *,
        check: Literal["rows", "records"] = "rows",
    ) -> VersionInfo:
        """Verify the staged parts, then publish the version record atomically.

        ``check="rows"`` reads every row back: each file (readable Parquet, schema, width, no
        null/NaN/inf vectors, norms if ``normalized``) and against its part record (byte size,
        rows, id fingerprint), ids unique across files. ``check="records"`` reads only the
        listing and the part records (O(parts), no row data; see ``checks.py``): every
        part must be a 1:1 map of its input chunk, as the transform writes them. Then the
        total row count and ids are checked against ``expected_rows`` / ``expected_ids`` (an
        array of ids, or an :class:`IdFingerprint`, the only form ``"records"`` takes).

        Raises:
            PublishConflictError: the version exists, before or after verification (lost race).
            LeaseLostError: another writer took this staging area over.
            VerificationError: a part is foreign (no record, or not the file its record
                describes), or the rows differ from what was expected.
        """
        if check not in ("rows", "records"):
            raise StoreError(f"commit check must be 'rows' or 'records', got {check!r}")
        version = self.info.version
        self.check_writable(f"publish version {version}")
        parts = self.parts()
        if not parts:
            raise StoreError(f"{self.uri}: no part files to publish for version {version}")
        present = self.present()
        check_present(self, parts, present)
        self._write_intent(parts)  # gc keeps what it names while this commit runs
        check_young(self, parts, present, self.horizon_s)
        if check == "rows":
            rows, fingerprint, ids = scan_rows(self, parts)
        else:
            (rows, fingerprint), ids = sum_records(self, parts), None
        if rows == 0:
            raise StoreError(f"{self.uri}: the part files hold no rows")
        check_expected(self.uri, rows, fingerprint, ids, expected_rows, expected_ids)
        info = dataclasses.replace(
            self.info,
            rows=rows,
            created=now_utc(),
            files=[self._relative(r) for r in parts],
            file_info=[
                {"path": self._relative(r), "bytes": r.bytes, "sha256": r.sha256} for r in parts
            ],
            ids=fingerprint.to_dict(),
        )
        self.check_writable(f"publish version {version}")
        owner = None
        if isinstance(self.lease, Lease):
            self.lease.stop()  # nothing inside a published version is written again
            owner = self.lease.record.owner
        return publish_record(self._backend, self._record, info, self._lost_publish_race, owner)

    def _write_intent(self, parts: list[PartRecord]) -> None:
        """Create ``_intent/<file>.json`` naming the files this commit is about to list, so
        that gc, which re-reads intents just before deleting, never removes them meanwhile."""
        self.check_writable(f"publish version {self.info.version}")
        ref = self.lease_ref
        intent = {
            "version": self.info.version,
            "generation": ref.generation,
            "written": now_utc(),
            "files": [self._relative(r) for r in parts],
        }
        path = join(self.path, INTENT_DIR, f"g{ref.generation}-{uuid.uuid4().hex[:8]}.json")
        try:
            self._backend.create_exclusive(path, json.dumps(intent, indent=1).encode())
        except OSError as error:
            raise self._changed_under_us("write its commit intent", error) from None

    def _lost_publish_race(self) -> VersionInfo:
        raise PublishConflictError(
            f"{self._backend.uri(self._record)} was published by another writer first"
        )

    def _relative(self, record: PartRecord) -> str:
        """A part file's path relative to the gallery prefix (as version records list it)."""
        return join(self.path, record.file)[len(self._gallery_path) + 1 :]

    def release(self) -> None:
        """Give the lease up (keeping the parts), so that a rerun can resume at once. Nothing to
        give up after :meth:`abort`, which released it."""
        if isinstance(self.lease, Lease) and not self._aborted:
            self.lease.release()

    def abort(self) -> None:
        """Withdraw this writer's run: release the lease marked *aborted*, so that no later
        writer adopts a part of this generation or an older one (a rerun starts afresh), then
        delete the files this writer wrote itself (its generation's part files, part records
        and intents) if it still holds the newest generation. Nothing another writer wrote is
        deleted, nor this writer's files once another writer may have taken them: gc reclaims
        those after the store's retention (``retention.py``).

        Raises:
            StoreError: the version's record lists files of this prefix, or this staging area
                was not opened with ``GalleryStore.begin`` (no held lease).
            LeaseLostError: another writer has taken the staging area over.
        """
        if self._published_from_here():
            raise StoreError(f"{self.uri}: version {self.info.version} is published; not deleting")
        if not isinstance(self.lease, Lease):
            raise StoreError(f"{self.uri}: abort needs the held lease (GalleryStore.begin)")
        mine = self.lease.withdraw("abort the staging area")
        self._parts.clear()
        self._aborted = True
        if not mine:
            logger.warning(
                "%s: aborted; another writer took it meanwhile, nothing deleted", self.uri
            )
            return
        own = f"g{self.lease.ref.generation}-"
        for folder in (self.path, join(self.path, PARTS_DIR), join(self.path, INTENT_DIR)):
            selector = pafs.FileSelector(folder, allow_not_found=True)
            for entry in self.filesystem.get_file_info(selector):
                if entry.type == pafs.FileType.File and entry.base_name.startswith(own):
                    self._delete_own(entry.path)
        logger.info("aborted staging %s (its own files deleted; the rest is gc's)", self.uri)

    def _delete_own(self, path: str) -> None:
        try:
            self.filesystem.delete_file(path)
        except FileNotFoundError:
            pass
