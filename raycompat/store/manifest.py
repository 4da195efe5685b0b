"""Version records: the gallery manifest, one immutable JSON object per published version.

Layout under a gallery prefix (``docs/store.md``)::

    <gallery>/_versions/<version>.json       # the record: VersionInfo + the files it owns
    <gallery>/_data/<version>/<staging>/      # part files, written before the record exists

The manifest of a gallery is the set of its records, listed from ``_versions/``. Publishing a
version is one create-if-absent write of its record (``Backend.create_exclusive``: an ``O_EXCL``
style hard link locally, a PutObject with ``If-None-Match: *`` on S3), made only after every part
file has been written and verified. Why per-version records rather than one manifest file swapped
with a sequence number:

- no read-modify-write: publishers of different versions never contend, and two publishers of the
  same version contend on exactly one key, which both S3 and POSIX can arbitrate atomically (a
  single manifest would need compare-and-swap on its ETag plus retries, and a lock locally);
- a record is written once and never changed, so readers can cache it, and a reader that lists
  ``_versions/`` sees each version either complete (record present, files complete) or not at all;
- S3 LIST is strongly consistent (since 2020), so a listed record is readable.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from raycompat.errors import CorruptFileError, ManifestError, StoreError
from raycompat.store.formats.external import ExternalFiles
from raycompat.store.paths import check_name, check_relative_path, join
from raycompat.store.records import check_record, load_object

RECORD_FORMAT = "raycompat.store/1"
_META_FIELDS = (
    "version",
    "model_version",
    "width",
    "normalized",
    "lineage",
    "side_info_width",
    "dtype",
)
EMBEDDING_DTYPES = ("float32", "float16")
_OMIT_IF_NONE = ("external", "file_info", "operation", "parameters", "by")
VERSIONS_DIR, DATA_DIR, INDEX_DIR = "_versions", "_data", "_index"
_HEX64 = re.compile(r"[0-9a-f]{1,16}")


@dataclass
class VersionInfo:
    """What a version holds and where it came from.

    Attributes:
        version: safe name of this version (``"v3"``).
        model_version: the model that produced (or, via a transformation, defines) the embeddings.
        width: embedding width ``d``; every row is a ``fixed_size_list<dtype>[d]``.
        normalized: rows are L2-normalised (checked to 1e-3 on validation).
        lineage: how the rows were made, e.g. ``"v3 = h_3(v2)"`` or ``"v3 = extract(model_3)"``.
        side_info_width: width of the optional ``side_info`` column, ``None`` if absent.
        rows, files, created: filled in by ``Staging.commit``; ``files`` are relative to the
            gallery prefix, ``created`` is an ISO-8601 UTC time.
        ids: the id fingerprint of the version (``part_record.IdFingerprint.to_dict``), filled
            in by ``Staging.commit``; None in records written before it existed.
        dtype: how embeddings are stored, ``"float32"`` or ``"float16"`` (half the bytes; read
            back as float32 for compute). ``side_info`` stays float32.
        external: set only for a version adopted in place (``formats/adopt.py``): the folder or
            S3 prefix its ``files`` are relative to, the column names, and each file's pin
            (size, ETag or mtime); see ``formats/external.py``. None for versions whose files the
            store wrote.
        file_info: for a version the store wrote, one ``{"path", "bytes", "sha256"}`` per file
            of ``files`` (same order), from the part records; readers refuse a file whose size
            differs. None in records written before it existed, and for adopted versions
            (their pins play that part).
        operation / parameters: what made the version (``"transform"``, ``"extract"``,
            ``"partial_backfill"``, ``"adopt"``) and its small inputs (source, digests of
            the weights, budget...), as Delta's ``DESCRIBE HISTORY`` gives them
            (``publish.with_operation``; credentials never). None in older records.
        by: who published it, ``asdict(LeaseOwner)`` (job, host, pid, user); filled in by
            ``publish.publish_record``. None in older records.
    """

    version: str
    model_version: str
    width: int
    normalized: bool
    lineage: str
    side_info_width: int | None = None
    rows: int = 0
    files: list[str] = field(default_factory=list)
    created: str = ""
    ids: dict | None = None
    dtype: str = "float32"
    external: dict | None = None
    file_info: list[dict] | None = None
    operation: str | None = None
    parameters: dict | None = None
    by: dict | None = None

    def __post_init__(self) -> None:
        check_name("version", self.version)
        for name in ("model_version", "lineage"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise StoreError(f"version {self.version}: {name} must be a non-empty string")
        widths = {"width": self.width, "side_info_width": self.side_info_width}
        for name, value in widths.items():
            if name == "side_info_width" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StoreError(f"version {self.version}: {name} must be a positive int")
        if not isinstance(self.normalized, bool):
            raise StoreError(f"version {self.version}: normalized must be a bool")
        if self.dtype not in EMBEDDING_DTYPES:
            raise StoreError(
                f"version {self.version}: dtype must be one of {EMBEDDING_DTYPES}, "
                f"got {self.dtype!r}"
            )

    def schema_metadata(self) -> dict[str, str]:
        """``raycompat.<field>`` -> string, for the fields that describe the version's rows."""
        return {f"raycompat.{k}": str(getattr(self, k)) for k in _META_FIELDS}

    def to_json(self) -> bytes:
        raw = asdict(self)
        for optional in _OMIT_IF_NONE:  # absent rather than null, as before
            if raw[optional] is None:
                del raw[optional]
        return json.dumps({"format": RECORD_FORMAT, **raw}, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, source: str) -> VersionInfo:
        """Parse and schema-check a record; ``source`` (its path) is named in every error.

        Raises:
            CorruptFileError: not JSON, a key missing, unknown or of the wrong type or range.
            ManifestError: the record lists no files.
            UnsafePathError: a listed file could escape the gallery prefix.
        """
        raw = load_object(data, source, "version record")
        if raw.pop("format", None) != RECORD_FORMAT:
            raise CorruptFileError(f"{source}: not a {RECORD_FORMAT} version record")
        check_record(raw, cls, source, "version record")
        try:
            info = cls(**raw)
        except StoreError as error:
            raise CorruptFileError(f"{source}: {error}") from None
        if info.rows < 0:
            raise CorruptFileError(
                f"{source}: version record key 'rows' must be an int >= 0, got {info.rows}"
            )
        if info.ids is not None:
            _check_ids(info.ids, source)
        if not info.files:
            raise ManifestError(f"{source}: record lists no files")
        for path in info.files:
            check_relative_path(path, source)
        if info.external is not None:
            ExternalFiles.from_record(info, source)
        if info.file_info is not None:
            _check_file_info(info, source)
        return info

    def file_sizes(self) -> dict[str, int]:
        """``relative path -> byte size`` of the version's files (empty when not recorded).
        Built once per record object: every file open of a read asks it."""
        sizes = self.__dict__.get("_file_sizes")
        if sizes is None:
            sizes = {entry["path"]: entry["bytes"] for entry in self.file_info or []}
            self.__dict__["_file_sizes"] = sizes
        return sizes


def _check_file_info(info: VersionInfo, source: str) -> None:
    """``file_info`` names exactly ``files``, in order, each with an int size >= 0."""
    paths = [entry.get("path") if isinstance(entry, dict) else None for entry in info.file_info]
    if paths != info.files:
        raise CorruptFileError(f"{source}: version record key 'file_info' does not match 'files'")
    for entry in info.file_info:
        size = entry.get("bytes")
        if type(size) is not int or size < 0:
            raise CorruptFileError(
                f"{source}: version record key 'file_info' gives {entry['path']} a byte size "
                f"of {size!r}"
            )


def _check_ids(ids: dict, source: str) -> None:
    """``ids`` is ``{"count": int >= 0, "sum": hex, "xor": hex}`` (``IdFingerprint.to_dict``)."""
    if set(ids) != {"count", "sum", "xor"}:
        raise CorruptFileError(
            f"{source}: version record key 'ids' must have the keys count, sum, xor; "
            f"it has {sorted(ids)}"
        )
    count = ids["count"]
    if type(count) is not int or count < 0:
        raise CorruptFileError(
            f"{source}: version record key 'ids.count' must be an int >= 0, got {count!r}"
        )
    for key in ("sum", "xor"):
        if not (isinstance(ids[key], str) and _HEX64.fullmatch(ids[key])):
            raise CorruptFileError(
                f"{source}: version record key 'ids.{key}' must be 1-16 hex digits, "
                f"got {ids[key]!r}"
            )


def record_path(gallery_path: str, version: str) -> str:
    return join(gallery_path, VERSIONS_DIR, f"{check_name('version', version)}.json")


def staging_path(gallery_path: str, version: str, staging_name: str) -> str:
    return join(gallery_path, DATA_DIR, version, check_name("staging", staging_name))


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")
