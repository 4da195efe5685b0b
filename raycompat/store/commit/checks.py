"""What ``Staging.commit`` checks before publishing: every row, or only the part records.

- ``check="rows"`` (:func:`scan_rows`): read every part back in bounded-memory batches
  (schema, values, the id fingerprint against the part record) and check ids unique across the
  version. O(rows) time, and the ids of the whole version on the driver: right for versions
  built by hand (``write_table``) and for extraction, whose ids nothing else vouches for.
Both check only the writer's own list of parts (``Staging.parts``) and first that each of them
is present with its recorded byte size (:func:`check_present`) and younger than the commit
horizon (:func:`check_young`, ``retention.py``).

- ``check="records"`` (:func:`sum_records`): read only the listing (byte sizes) and the part
  records. Each part must be the file its record describes (same byte size), hold exactly the
  ids of its input chunk (``input_ids == ids``: the writer mapped its rows 1:1), and the parts'
  fingerprints must add up to the expected one (the source version's). A unique source and a
  1:1 map give unique ids, so no row is read: O(parts) time and driver memory. This is the
  transform's path (issue 15); the writers validated every row (schema, NaN/inf, nulls) as they
  wrote it, and page checksums guard the bytes on every later read.
"""

from __future__ import annotations

import time
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from raycompat.errors import SchemaError, StoreError, VerificationError
from raycompat.store.commit.part_record import IdFingerprint, PartRecord
from raycompat.store.paths import join
from raycompat.store.read.parquet import iter_file_batches, open_parquet
from raycompat.store.schema import check_unique_ids, validate_schema, validate_values

RECORD_READERS = 16  # concurrent part-record reads (one small GET each on S3)


class StaleCommitError(VerificationError):
    """A listed part file is older than the commit horizon (``retention.py``)."""


def _foreign(source: str, detail: str) -> VerificationError:
    return VerificationError(
        f"{source}: {detail}: the file was not written (or was replaced) by this staging area's "
        f"writers; rerun the job to rewrite it"
    )


def check_present(staging, parts: list[PartRecord], present: dict[str, tuple]) -> None:
    """Every part on the writer's list is in the prefix (``Staging.present``: path -> (size,
    mtime)) with its recorded byte size; else nothing is published (a missing part would make
    a smaller version)."""
    for record in parts:
        path = join(staging.path, record.file)
        size = present[path][0] if path in present else None
        if size is None:
            raise VerificationError(
                f"{staging.uri_of(path)}: part {record.part} (written by lease generation "
                f"{record.generation}) is missing: the staging area was changed behind this "
                f"writer (gc, or a removal by hand); nothing published, rerun the job"
            )
        if size != record.bytes:
            raise _foreign(
                staging.uri_of(path), f"{size} bytes but its part record says {record.bytes}"
            )


def written_at(record: PartRecord, mtime: float | None) -> float:
    """When a part file was written: its modification time (gc's clock), else, where the
    filesystem gives none (pyarrow over fsspec), its record's ``written``."""
    if mtime is not None:
        return mtime
    try:
        return datetime.fromisoformat(record.written).timestamp()
    except (TypeError, ValueError):
        return 0.0  # no date at all: too old to trust


def check_young(
    staging, parts: list[PartRecord], present: dict[str, tuple], horizon_s: float
) -> None:
    """Every listed part file is younger than ``horizon_s`` (half the store's retention) by
    :func:`written_at`: an older one may be gc's to delete before the record names it, so
    nothing is published and a rerun rewrites it."""
    now = time.time()
    for record in parts:
        path = join(staging.path, record.file)
        age = now - written_at(record, present[path][1])
        if age > horizon_s:
            raise StaleCommitError(
                f"{staging.uri_of(path)}: part {record.part} was written {age / 3600:.3g} h ago, "
                f"more than half the store's retention ({horizon_s / 1800:.3g} h), so gc may "
                f"delete it; nothing published, rerun the job to rewrite it"
            )


def scan_rows(staging, parts: list[PartRecord]) -> tuple[int, IdFingerprint, list]:
    """Read and check every row of ``parts``; returns ``(rows, fingerprint, [(source, ids)])``."""
    ids, rows, first, fingerprint = [], 0, None, IdFingerprint()
    for record in parts:
        path = join(staging.path, record.file)
        source = staging.uri_of(path)
        with open_parquet(staging.filesystem, path, source) as parquet:
            if parquet.metadata.num_rows != record.rows:
                raise _foreign(
                    source, f"{parquet.metadata.num_rows} rows but its record says {record.rows}"
                )
            schema = parquet.schema_arrow
            validate_schema(schema, staging.info, source)
            first = first or (source, [(f.name, f.type) for f in schema])
            if [(f.name, f.type) for f in schema] != first[1]:
                raise StoreError(f"{source}: schema {schema} differs from {first[0]}")
            file_ids = []
            for batch, offset in iter_file_batches(parquet, source):
                validate_values(batch, staging.info, source, offset)
                file_ids.append(batch.column("id"))
                rows += batch.num_rows
            empty = pa.array([], type=schema.field("id").type)
            ids.append((source, pa.concat_arrays(file_ids) if file_ids else empty))
        found = IdFingerprint.of(ids[-1][1])
        if found != record.ids:
            raise _foreign(source, f"ids ({found}) differ from its part record ({record.ids})")
        fingerprint = fingerprint.combine(found)
    check_unique_ids(ids)
    return rows, fingerprint, ids


def sum_records(staging, parts: list[PartRecord]) -> tuple[int, IdFingerprint]:
    """Check the part records only; returns ``(rows, fingerprint)`` of the version."""
    rows, fingerprint = 0, IdFingerprint()
    for record in parts:
        source = staging.uri_of(join(staging.path, record.file))
        if record.input_ids is None:
            raise VerificationError(
                f"{source}: its part record has no input fingerprint (the part is not a 1:1 "
                f"map of input rows); commit with check='rows'"
            )
        if record.ids != record.input_ids or record.ids.count != record.rows:
            raise VerificationError(
                f"{source}: holds {record.rows} rows with ids ({record.ids}) but its input chunk "
                f"had ({record.input_ids}): rows were lost, duplicated or changed"
            )
        if record.null_ids or record.nonfinite:
            raise SchemaError(
                f"{source}: its record counts {record.null_ids} null ids and {record.nonfinite} "
                f"non-finite vectors"
            )
        rows += record.rows
        fingerprint = fingerprint.combine(record.ids)
    return rows, fingerprint


def check_expected(
    uri: str, rows: int, fingerprint: IdFingerprint, ids: list | None, expected_rows, expected_ids
) -> None:
    """Row count and ids against what the publisher expected (``expected_ids``: an array of
    ids, or an :class:`IdFingerprint`); ``ids`` are the scanned ``(source, ids)`` or None."""
    if expected_rows is not None and rows != expected_rows:
        raise VerificationError(f"{uri}: staged {rows} rows, expected {expected_rows}")
    if expected_ids is None:
        return
    if isinstance(expected_ids, IdFingerprint):
        if fingerprint != expected_ids:
            raise VerificationError(
                f"{uri}: staged ids ({fingerprint}) differ from the expected ({expected_ids})"
            )
        return
    if ids is None:
        raise VerificationError(f"{uri}: check='records' compares ids by fingerprint only")
    _compare_ids(uri, [a for _, a in ids], expected_ids)


def _compare_ids(uri: str, ids: list, expected_ids) -> None:
    staged = pa.chunked_array(ids, type=ids[0].type)
    try:
        if isinstance(expected_ids, pa.ChunkedArray):
            expected_ids = expected_ids.combine_chunks()
        expected = pa.array(expected_ids).cast(staged.type)
    except (pa.ArrowException, TypeError) as error:
        raise VerificationError(
            f"{uri}: expected_ids cannot be compared with {staged.type} ids ({error})"
        ) from None
    missing = pc.filter(expected, pc.invert(pc.is_in(expected, value_set=staged)))
    extra = pc.filter(staged, pc.invert(pc.is_in(staged, value_set=expected)))
    if len(missing) or len(extra) or len(expected) != len(staged):
        raise VerificationError(
            f"{uri}: staged id set differs from expected_ids: {len(missing)} missing "
            f"(e.g. {missing[:3].to_pylist()}), {len(extra)} unexpected "
            f"(e.g. {extra[:3].to_pylist()}), {len(staged)} staged vs {len(expected)} expected"
        )
