"""MXNet RecordIO (``.rec`` + ``.idx``) read and written in pure Python, without mxnet.

Record layout (dmlc-core ``recordio.cc``): ``uint32 magic = 0xced7230a``, ``uint32 lrecord``
(upper 3 bits: continuation flag ``cflag``, lower 29 bits: part length), the part's bytes, zero
padding to a multiple of 4. A payload that contains the magic word at a 4-aligned position is
split there into parts (cflag 1 = first, 2 = middle, 3 = last; 0 = whole record) and the reader
joins the parts with the magic word. ``.idx`` lines are ``key<TAB>offset``.

Payloads written by ``mx.recordio.pack`` start with the image-record header ``IRHeader``
(struct ``<IfQQ``: flag, label, id, id2); when ``flag > 0``, ``flag`` float32 labels follow the
header and ``label`` is ignored. The encoded image bytes come last.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raycompat.data.base import CorruptDataError

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_IR = struct.Struct("<IfQQ")


@dataclass(frozen=True)
class IRHeader:
    """``label`` is a float when ``flag == 0``, else a float32 array of ``flag`` values."""

    flag: int
    label: float | np.ndarray
    id: int
    id2: int


def pack_record(header: IRHeader, data: bytes) -> bytes:
    """``mx.recordio.pack``: an array label is stored after the header with ``flag = size``."""
    label = np.asarray(header.label, dtype=np.float32)
    if label.ndim == 0:
        return _IR.pack(0, float(label), header.id, header.id2) + data
    return _IR.pack(label.size, 0.0, header.id, header.id2) + label.tobytes() + data


def unpack_record(payload: bytes, name: str = "record") -> tuple[IRHeader, bytes]:
    """``mx.recordio.unpack``: payload -> (header, image bytes)."""
    if len(payload) < _IR.size:
        raise CorruptDataError(f"{name}: {len(payload)} bytes, shorter than the IRHeader")
    flag, label, id_, id2 = _IR.unpack_from(payload)
    rest = memoryview(payload)[_IR.size :]
    if flag > 0:
        if len(rest) < 4 * flag:
            raise CorruptDataError(f"{name}: header announces {flag} labels, payload too short")
        label = np.frombuffer(rest[: 4 * flag], dtype=np.float32).copy()
        rest = rest[4 * flag :]
    return IRHeader(flag, label, id_, id2), bytes(rest)


def read_index(path_idx: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """``.idx`` file -> (keys int64 (N,), offsets int64 (N,)) in file order."""
    path = Path(path_idx)
    if not path.is_file():
        raise FileNotFoundError(
            f"RecordIO index not found: {path} (expected 'key<TAB>offset' lines)"
        )
    keys, offsets = [], []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2 or not (fields[0].isdigit() and fields[1].isdigit()):
                raise CorruptDataError(f"{path}:{number}: expected 'key<TAB>offset', got {line!r}")
            keys.append(int(fields[0]))
            offsets.append(int(fields[1]))
    return np.asarray(keys, dtype=np.int64), np.asarray(offsets, dtype=np.int64)


class RecordIOReader:
    """Random access to a ``.rec`` file by key (``.idx`` given) or by record order.

    Without an ``.idx`` the file is scanned once and records get keys ``0..N-1``. The file handle
    is reopened in each process, so the reader can be shipped to DataLoader workers.
    """

    def __init__(self, path_rec: str | os.PathLike, path_idx: str | os.PathLike | None = None):
        self.path = Path(path_rec)
        if not self.path.is_file():
            raise FileNotFoundError(f"RecordIO file not found: {self.path} (expected a .rec file)")
        self._handle = None
        self._pid = None
        if path_idx is not None:
            self.keys, self.offsets = read_index(path_idx)
        else:
            self.offsets = self._scan()
            self.keys = np.arange(len(self.offsets), dtype=np.int64)
        self._offset_of = dict(zip(self.keys.tolist(), self.offsets.tolist(), strict=True))

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key: object) -> bool:
        return key in self._offset_of

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handle": None, "_pid": None}

    def _file(self):
        if self._handle is None or self._pid != os.getpid():
            self._handle, self._pid = open(self.path, "rb"), os.getpid()
        return self._handle

    def close(self) -> None:
        if self._handle is not None and self._pid == os.getpid():
            self._handle.close()
        self._handle = None

    def _part_header(self, offset: int) -> tuple[int, int]:
        handle = self._file()
        handle.seek(offset)
        head = handle.read(8)
        if len(head) != 8:
            raise CorruptDataError(f"{self.path}: truncated record header at offset {offset}")
        magic, lrecord = struct.unpack("<II", head)
        if magic != MAGIC:
            raise CorruptDataError(
                f"{self.path}: bad RecordIO magic {magic:#010x} at offset "
                f"{offset} (expected {MAGIC:#010x})"
            )
        return lrecord >> 29, lrecord & ((1 << 29) - 1)

    def read_at(self, offset: int) -> bytes:
        """The payload of the record starting at byte ``offset`` (parts joined)."""
        parts, position = [], int(offset)
        while True:
            cflag, length = self._part_header(position)
            if (cflag in (0, 1)) == bool(parts):
                raise CorruptDataError(
                    f"{self.path}: unexpected continuation flag {cflag} at offset {position}"
                )
            data = self._file().read(length)
            if len(data) != length:
                raise CorruptDataError(f"{self.path}: record at offset {position} is truncated")
            parts.append(data)
            position += 8 + ((length + 3) & ~3)
            if cflag in (0, 3):
                return _MAGIC_BYTES.join(parts)

    def _offset(self, key: int) -> int:
        try:
            return self._offset_of[int(key)]
        except KeyError:
            raise KeyError(f"key {key} is not in the index of {self.path}") from None

    def read(self, key: int) -> bytes:
        """The payload of the record with ``key`` (as listed in the ``.idx``)."""
        return self.read_at(self._offset(key))

    def read_header(self, key: int) -> IRHeader:
        """Only the IRHeader of record ``key``: reads a few bytes, not the image."""
        offset = self._offset(key)
        cflag, length = self._part_header(offset)
        head = self._file().read(min(length, _IR.size))
        if cflag == 0 and len(head) == _IR.size:
            flag = _IR.unpack_from(head)[0]
            if _IR.size + 4 * flag <= length:
                head += self._file().read(4 * flag)
                return unpack_record(head, f"{self.path} key {key}")[0]
        return unpack_record(self.read_at(offset), f"{self.path} key {key}")[0]

    def _scan(self) -> np.ndarray:
        """Offsets of every record, by walking the file once."""
        offsets, position, size = [], 0, self.path.stat().st_size
        while position < size:
            cflag, length = self._part_header(position)
            if cflag in (0, 1):
                offsets.append(position)
            position += 8 + ((length + 3) & ~3)
        return np.asarray(offsets, dtype=np.int64)


def _encode_parts(payload: bytes) -> bytes:
    """dmlc ``RecordIOWriter::WriteRecord``: split at 4-aligned magic words, pad to 4 bytes."""
    if len(payload) >= 1 << 29:
        raise ValueError(f"a RecordIO record holds < 2**29 bytes, got {len(payload)}")
    chunks, start, i = [], 0, payload.find(_MAGIC_BYTES)
    while i >= 0:
        if i % 4 == 0:
            chunks.append((2 if chunks else 1, payload[start:i]))
            start = i + 4
            i = payload.find(_MAGIC_BYTES, start)
        else:
            i = payload.find(_MAGIC_BYTES, i + 1)
    chunks.append((3 if chunks else 0, payload[start:]))
    out = bytearray()
    for cflag, chunk in chunks:
        out += struct.pack("<II", MAGIC, (cflag << 29) | len(chunk)) + chunk
        out += b"\0" * (-len(chunk) % 4)
    return bytes(out)


def write_recordio(
    path_rec: str | os.PathLike,
    path_idx: str | os.PathLike,
    items: Iterable[tuple[int, bytes]],
) -> int:
    """Write ``(key, payload)`` records (payloads usually from :func:`pack_record`) and the
    ``.idx``. Returns the number of records written."""
    count = 0
    with open(path_rec, "wb") as rec, open(path_idx, "w") as idx:
        for key, payload in items:
            idx.write(f"{int(key)}\t{rec.tell()}\n")
            rec.write(_encode_parts(bytes(payload)))
            count += 1
    return count
