"""Row number -> gallery id, read from a memory-mapped Arrow IPC file.

A sharded IVF index labels its vectors with their row numbers in the version. Searching maps
only the ``(Q, k)`` result rows back to ids: the file (``ids.arrow``, written in row order by
``shard_tasks.write_ids``) is memory-mapped, its record batches are zero-copy views, and a lookup
takes the asked rows from them. Nothing of size N is built in memory, in particular no NumPy
object array of string ids.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import pyarrow as pa

FEW_ROWS = 64  # a lookup of at most this many rows walks them in Python (MappedIds._few)


class MappedIds:
    """``ids[rows]`` for an int64 array of row numbers of any shape, as the flat index's ids
    array would answer it: int64 ids, or an object array holding only the looked-up strings.

    Attributes:
        dtype: ``int64`` for integer ids, ``object`` for string ids (like ``VersionIndex.ids``).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        source = pa.memory_map(self.path, "r")
        reader = pa.ipc.open_file(source)
        self._columns = [reader.get_batch(b).column(0) for b in range(reader.num_record_batches)]
        self._starts = np.cumsum([0] + [len(c) for c in self._columns], dtype=np.int64)
        integer = pa.types.is_integer(reader.schema.field(0).type)
        self.dtype = np.dtype(np.int64) if integer else np.dtype(object)
        # Integer ids (never null): zero-copy NumPy views of the mapped batches, so a lookup is
        # a NumPy gather (about 1 us for a query's k rows) rather than an Arrow take.
        self._views = [int64_values(c) for c in self._columns] if integer else None
        self._file, self._shift = _file_shifts(source, self._columns, self._starts)
        self._len = int(self._starts[-1])
        self._starts_list = self._starts.tolist()
        self._shift_list = None if self._shift is None else self._shift.tolist()

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        flat = rows.reshape(-1)
        if self._shift is not None and flat.size <= FEW_ROWS:
            return self._file[self._few(flat)].reshape(rows.shape)
        if flat.size and (flat.min() < 0 or flat.max() >= self._len):
            raise self._outside(flat)
        if self._views is not None and len(self._views) == 1:
            return self._views[0][rows]
        if self._shift is not None:  # one gather over the whole file, whatever batch holds a row
            at = self._shift[np.searchsorted(self._starts, flat, side="right")] + flat
            return self._file[at].reshape(rows.shape)
        out = np.empty(flat.shape, self.dtype)
        batch = np.searchsorted(self._starts, flat, side="right") - 1
        for b in np.flatnonzero(np.bincount(batch)):  # the batches hit (cheaper than unique)
            here = batch == b
            local = flat[here] - self._starts[b]
            if self._views is not None:
                out[here] = self._views[b][local]
            else:
                out[here] = self._columns[b].take(pa.array(local)).to_numpy(zero_copy_only=False)
        return out.reshape(rows.shape)

    def _few(self, flat: np.ndarray) -> list[int]:
        """Where the ids of ``flat`` (at most ``FEW_ROWS`` row numbers) are in the file, found
        row by row in Python: a query's top-k costs less so than in NumPy calls (44 us of a
        300 us search when its caches are cold; ``benchmarks/gallery_handle.py``)."""
        starts, shift, at = self._starts_list, self._shift_list, []
        for row in flat.tolist():
            if not 0 <= row < self._len:
                raise self._outside(flat)
            at.append(shift[bisect.bisect_right(starts, row)] + row)
        return at

    def _outside(self, flat: np.ndarray) -> IndexError:
        return IndexError(
            f"row numbers must be in [0, {self._len}), got {flat.min()}..{flat.max()}"
        )


def _file_shifts(
    source: pa.MemoryMappedFile, columns: list[pa.Array], starts: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(file, shift)``: the mapped file as int64 values, and per batch (indexed by
    ``searchsorted(starts, row, "right")``) what to add to a row number to find its id among
    them, when every batch holds int64 ids at an 8-byte aligned place of the mapping (an Arrow
    IPC file's buffers are aligned); else ``(None, None)``, and a lookup gathers batch by batch
    (35 us for one query's 10 ids over the 4 batches of a 1M-row version; 2 us in one gather).
    """
    if len(columns) < 2 or any(c.type != pa.int64() or not len(c) for c in columns):
        return None, None
    source.seek(0)
    whole = source.read_buffer(source.size())  # zero-copy: the mapping the batches view
    file = np.frombuffer(whole, np.int64, whole.size // 8)
    shift = [0]  # searchsorted gives 0 only to a row below 0, which a lookup refuses first
    for column, start in zip(columns, starts[:-1].tolist(), strict=True):
        offset = column.buffers()[1].address + column.offset * 8 - file.ctypes.data
        if offset % 8 or not 0 <= offset < 8 * len(file):
            return None, None
        shift.append(offset // 8 - start)
    return file, np.asarray(shift, np.int64)


def int64_values(column: pa.Array) -> np.ndarray:
    """The values of an integer Arrow array without nulls, as int64, from its data buffer
    (``Array.to_numpy`` would import pandas: 0.2-1 s of a CLI search)."""
    width = column.type.bit_width // 8
    data = np.frombuffer(
        column.buffers()[1], np.dtype(f"<i{width}"), len(column), column.offset * width
    )
    return data.astype(np.int64, copy=False)
