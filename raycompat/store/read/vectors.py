"""A stored vector column as a float32 ``(N, d)`` NumPy array: the one place float16 is widened.

Versions store ``embedding`` as ``fixed_size_list<float32>[d]`` or ``<float16>[d]`` (half the
bytes, docs/store.md); compute (faiss, torch, the pipelines) takes float32. :func:`widen_float16`
is NumPy's cast, which is exact (every IEEE binary16 value is a binary32 value; NaN payloads,
inf and subnormals included) and bit-identical to faiss's fp16 scalar-quantizer decoder that
issue 24 used here (``tests/store/read/test_vectors.py`` compares all 65,536 float16 values); the
store imports no faiss (issue 39). Both the value checks (``float32_rows``) and ``vectors`` use
it. benchmarks/float16_read.py measures the read and the cast against faiss's decoder.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_FLOATS = {
    t: np.dtype(n).newbyteorder("<")
    for t, n in [(pa.float16(), "f2"), (pa.float32(), "f4"), (pa.float64(), "f8")]
}


def vectors(table: pa.Table | pa.RecordBatch, name: str) -> np.ndarray:
    """A ``fixed_size_list<float32 | float16>[d]`` column as a writable float32 ``(N, d)``
    array (a copy: torch warns on Arrow's read-only buffers)."""
    column = table.column(name)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return float32_rows(column)


def float32_rows(column: pa.FixedSizeListArray, *, copy: bool = True) -> np.ndarray:
    """``(N, d)`` float32 rows of a fixed-size list array; ``copy=False`` may return a
    read-only view of Arrow's buffer (float32 values, for checks that only read them)."""
    width = column.type.list_size
    flat = _values(column.flatten())
    if flat.dtype == np.float16:
        return widen_float16(flat.reshape(len(column), width))
    if copy:
        return np.array(flat, dtype=np.float32).reshape(len(column), width)
    return np.asarray(flat, dtype=np.float32).reshape(len(column), width)


def _values(flat: pa.Array) -> np.ndarray:
    """A float array's values, zero-copy from its data buffer when it has no nulls (pyarrow's
    ``to_numpy`` imports pandas, a second of a CLI start); nulls become NaN."""
    dtype = _FLOATS.get(flat.type)
    if flat.null_count or dtype is None:
        return flat.to_numpy(zero_copy_only=False)
    return np.frombuffer(flat.buffers()[1], dtype, len(flat), flat.offset * dtype.itemsize)


def widen_float16(x: np.ndarray) -> np.ndarray:
    """``(N, d)`` float16 -> a new C-contiguous float32 ``(N, d)`` array, exactly."""
    return np.array(x, dtype=np.float32, order="C")
