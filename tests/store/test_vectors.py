"""raycompat.store.vectors: stored vector columns as float32, float16 widened exactly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raycompat.store.vectors import FAISS_MIN_VALUES, vectors, widen_float16


def column(x: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


def test_every_float16_bit_pattern_widens_to_numpys_float32_bits():
    # 65,536 values > FAISS_MIN_VALUES: the SIMD decoder, NaN payloads and subnormals included
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(-1, 64)
    assert every.size >= FAISS_MIN_VALUES
    got = widen_float16(every)
    assert got.dtype == np.float32 and got.shape == every.shape and got.flags.c_contiguous
    np.testing.assert_array_equal(got.view(np.uint32), every.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("rows", [3, 2_000])  # below and above FAISS_MIN_VALUES values
def test_vectors_of_a_float16_or_float32_column_sliced_or_chunked(rows):
    x = np.random.default_rng(0).normal(size=(rows, 16)).astype(np.float32)
    for stored in (np.float32, np.float16):
        want = x.astype(stored).astype(np.float32)
        arr = column(x.astype(stored))
        got = vectors(pa.table({"e": arr}), "e")
        assert got.flags.writeable and got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
        cut = rows // 3
        np.testing.assert_array_equal(vectors(pa.table({"e": arr.slice(cut)}), "e"), want[cut:])
        chunked = pa.table({"e": pa.chunked_array([arr.slice(0, cut), arr.slice(cut)])})
        np.testing.assert_array_equal(vectors(chunked, "e"), want)
