"""Part records: what the writer of a part file says it wrote, checked before publishing.

A part is one chunk of work (``part``, e.g. ``part-00003-0001.parquet``); the file that holds it
has a name unique to the writer attempt that made it (``file``, e.g.
``g2-1f0c9a7e.part-00003-0001.parquet``: lease generation 2, a random suffix), so no writer ever
replaces another's file. The writer creates ``<staging>/_parts/<file>.json`` (create-if-absent)
*before* moving the file into place (a kill between the two leaves a record without its file,
which a rerun redoes)::

    {"part": "part-00003-0001.parquet", "file": "g2-1f0c9a7e.part-00003-0001.parquet",
     "rows": 1000000, "bytes": 262400123, "sha256": "5e1f...",
     "ids": {"count": 1000000, "sum": "9f2c...", "xor": "03a1..."},
     "min_id": 17, "max_id": 998877, "null_ids": 0, "nonfinite": 0,
     "lease": {"generation": 2, "token": "..."}, "written": "2026-11-23T10:00:00+00:00",
     "input_ids": {"count": 1000000, "sum": "9f2c...", "xor": "03a1..."}}

``input_ids`` is the fingerprint of the ids the writer *read* (its input chunk) when the part is
a 1:1 map of input rows (a transform); None otherwise. ``sha256`` is the digest of the file's
bytes, computed as they were written; ``extra`` holds a pipeline's per-part counts (e.g. the
partial backfill's extracted/copied rows). Records written before ``file`` existed name the file
by ``part``.

``ids`` is an order-independent multiset fingerprint: the count, the sum (mod 2^64) and the xor
of a 64-bit hash of every id (pandas' ``hash_array``: SipHash with a fixed key for strings, a
fixed integer mix for int64, the same on every machine). Two parts hold the same ids, in any
order, iff their fingerprints match (up to hash collisions), and fingerprints of disjoint parts
add up (:meth:`IdFingerprint.combine`), so a version's fingerprint is computed from its parts.

A part whose file is not the one its record describes (different size, rows or ids), or that
has no record at all (written by a process that does not hold the staging area's lease), is a
*foreign* part: commit refuses it and resume redoes it.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raycompat.errors import CorruptFileError
from raycompat.store.paths import join

PARTS_DIR = "_parts"
INTENT_DIR = "_intent"  # a commit's intent records: the files it is about to list (gc keeps them)
PART_FORMAT = "raycompat.part/1"
_MASK = (1 << 64) - 1


def hash_ids(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A deterministic uint64 hash per id (int64 or string ids), shape ``(N,)``."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    values = ids.to_numpy(zero_copy_only=False)
    if values.dtype != np.int64:
        values = values.astype(object)
    import pandas as pd  # here, not at the top: the CLI's store reads never hash ids (~1 s)

    return pd.util.hash_array(values, categorize=False)


@dataclass
class IdFingerprint:
    """Multiset fingerprint of ids: count, sum and xor of their 64-bit hashes."""

    count: int = 0
    sum: int = 0
    xor: int = 0

    def update(self, ids: pa.Array | pa.ChunkedArray) -> IdFingerprint:
        h = hash_ids(ids)
        self.count += len(h)
        self.sum = (self.sum + int(np.add.reduce(h, dtype=np.uint64))) & _MASK
        self.xor ^= int(np.bitwise_xor.reduce(h)) if len(h) else 0
        return self

    @classmethod
    def of(cls, ids: pa.Array | pa.ChunkedArray) -> IdFingerprint:
        return cls().update(ids)

    def combine(self, other: IdFingerprint) -> IdFingerprint:
        """The fingerprint of the union of two disjoint id multisets."""
        return IdFingerprint(
            self.count + other.count, (self.sum + other.sum) & _MASK, self.xor ^ other.xor
        )

    def to_dict(self) -> dict:
        return {"count": self.count, "sum": f"{self.sum:016x}", "xor": f"{self.xor:016x}"}

    @classmethod
    def from_dict(cls, raw: dict) -> IdFingerprint:
        return cls(int(raw["count"]), int(raw["sum"], 16), int(raw["xor"], 16))

    def __str__(self) -> str:
        d = self.to_dict()
        return f"{d['count']} ids, sum {d['sum']}, xor {d['xor']}"


@dataclass
class PartRecord:
    """What a writer wrote into one part file (see the module docstring)."""

    part: str
    rows: int
    bytes: int
    ids: IdFingerprint
    min_id: int | str | None = None
    max_id: int | str | None = None
    null_ids: int = 0
    nonfinite: int = 0
    lease: dict = field(default_factory=dict)
    written: str = ""
    input_ids: IdFingerprint | None = None
    file: str = ""
    sha256: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.file = self.file or self.part

    @property
    def generation(self) -> int:
        """The lease generation of the writer that made the part (0 if unrecorded)."""
        return int(self.lease.get("generation", 0))

    def to_json(self) -> bytes:
        raw = {"format": PART_FORMAT, **asdict(self), "ids": self.ids.to_dict()}
        raw["input_ids"] = self.input_ids.to_dict() if self.input_ids else None
        return json.dumps(raw, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, source: str) -> PartRecord:
        try:
            raw = json.loads(data)
            if raw.pop("format") != PART_FORMAT:
                raise ValueError(f"not a {PART_FORMAT} record")
            raw["ids"] = IdFingerprint.from_dict(raw["ids"])
            if raw.get("input_ids") is not None:
                raw["input_ids"] = IdFingerprint.from_dict(raw["input_ids"])
            record = cls(**raw)
            if not isinstance(record.rows, int) or not isinstance(record.bytes, int):
                raise ValueError("rows and bytes must be integers")
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CorruptFileError(f"{source}: unreadable part record ({error})") from None
        return record


class IdStats:
    """Running fingerprint, min/max and null count of the ids a writer streams out."""

    def __init__(self) -> None:
        self.fingerprint = IdFingerprint()
        self.min_id = self.max_id = None
        self.null_ids = 0

    def update(self, ids: pa.Array | pa.ChunkedArray) -> None:
        self.null_ids += ids.null_count
        self.fingerprint.update(ids)
        if len(ids) == ids.null_count:
            return
        bounds = pc.min_max(ids)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        self.min_id = lo if self.min_id is None else min(self.min_id, lo)
        self.max_id = hi if self.max_id is None else max(self.max_id, hi)


def part_record_path(staging_path: str, file: str) -> str:
    """Where the record of the part file ``file`` (its writer-unique name) lives."""
    return join(staging_path, PARTS_DIR, f"{file}.json")


def part_file_name(part: str, generation: int) -> str:
    """A name for a new file of ``part`` that no other writer (or attempt) can produce:
    ``part-00003-0001.parquet`` -> ``g2-1f0c9a7e.part-00003-0001.parquet`` (lease generation,
    random suffix; the part name stays whole at the end, so messages still read naturally)."""
    return f"g{generation}-{uuid.uuid4().hex[:8]}.{part}"


_FILE_PREFIX = re.compile(r"g\d+-[0-9a-f]{8}")


def part_of_file(path: str) -> str:
    """The part name a file holds: ``.../g2-1f0c9a7e.part-00003-0001.parquet`` ->
    ``part-00003-0001.parquet`` (the inverse of :func:`part_file_name`; a name without the
    writer prefix, as written before it existed, is returned as it is)."""
    name = path.rsplit("/", 1)[-1]
    head, sep, rest = name.partition(".")
    return rest if sep and _FILE_PREFIX.fullmatch(head) else name


class HashingSink:
    """A writable file object over a pyarrow output stream that counts and hashes the bytes
    passing through, so a part's size and sha256 are known without reading it back."""

    def __init__(self, stream) -> None:
        self._stream, self._digest, self.bytes, self.closed = stream, hashlib.sha256(), 0, False

    def write(self, data) -> int:
        self._digest.update(data)
        self.bytes += len(data)
        return self._stream.write(data)

    def tell(self) -> int:
        return self.bytes

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            self.closed = True

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()
