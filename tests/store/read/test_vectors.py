"""raycompat.store.read.vectors: stored vector columns as float32, float16 widened exactly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raycompat.store.read.vectors import vectors, widen_float16

# Every float16 bit pattern: zeros, subnormals, normals, inf, and NaNs with every payload.
EVERY = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(-1, 64)


def column(x: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


def test_every_float16_bit_pattern_widens_exactly():
    got = widen_float16(EVERY)
    assert got.dtype == np.float32 and got.shape == EVERY.shape and got.flags.c_contiguous
    finite = ~np.isnan(got)  # binary16 -> binary32 is exact: narrowing back gives the same bits
    assert finite.sum() == (1 << 16) - 2 * 1023
    np.testing.assert_array_equal(
        got[finite].astype(np.float16).view(np.uint16), EVERY.view(np.uint16)[finite]
    )
    assert np.isnan(got).sum() == 2 * 1023 and np.isinf(got).sum() == 2


def test_numpys_cast_is_bit_identical_to_faiss_fp16_decoder():
    """What store/read/vectors.py used before issue 39 (faiss's SIMD QT_fp16 decoder): same bits for
    all 65,536 float16 values, NaN payloads and subnormals included."""
    faiss = pytest.importorskip("faiss")
    quantizer = faiss.ScalarQuantizer(EVERY.shape[1], faiss.ScalarQuantizer.QT_fp16)
    decoded = quantizer.decode(EVERY.view(np.uint8))
    np.testing.assert_array_equal(widen_float16(EVERY).view(np.uint32), decoded.view(np.uint32))


@pytest.mark.parametrize("rows", [3, 2_000])
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
