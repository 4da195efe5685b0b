"""Value checks of ``raycompat/store/schema.py``: the vectorised fast paths (finite check,
norms, increasing int ids) give the same verdicts and messages as the row-wise checks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raycompat.store import DuplicateIdError, SchemaError, VersionInfo, embedding_table
from raycompat.store.schema import all_finite, check_unique_ids, validate_values

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, None])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_all_finite_matches_isfinite(bad, dtype):
    x = RNG.standard_normal((50, 7)).astype(dtype)
    if bad is not None:
        x[31, 4] = bad
    assert all_finite(x) == bool(np.isfinite(x).all())
    assert all_finite(np.empty((0, 7), dtype))


def test_non_finite_rows_are_counted_and_the_first_named():
    x = RNG.standard_normal((20, 4), dtype=np.float32)
    x[9, 0], x[5, 3] = np.inf, np.nan
    table = embedding_table(np.arange(20), x)
    with pytest.raises(SchemaError, match=r"f\.parquet: 2 row\(s\) of embedding .* row 105$"):
        validate_values(table, 4, "f.parquet", row_offset=100)


@pytest.mark.parametrize("scale, ok", [(1 + 0.9e-3, True), (1 - 0.9e-3, True), (1.0011, False)])
def test_unit_norm_tolerance(scale, ok):
    x = RNG.standard_normal((10, 16), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[7] *= scale
    info = VersionInfo("v1", "m", 16, True, "v1")
    table = embedding_table(np.arange(10), x)
    if ok:
        validate_values(table, info, "f")
    else:
        with pytest.raises(SchemaError, match=r"1 row\(s\) .* first is row 7 \(norm 1\.001"):
            validate_values(table, info, "f")


@pytest.mark.parametrize(
    "ids",
    [[1, 2, 3, 10], [3, 1, 2], [5], []],
    ids=["increasing", "unsorted", "one", "empty"],
)
def test_unique_ids_pass(ids):
    check_unique_ids([("f", pa.array(ids, pa.int64()))])


@pytest.mark.parametrize("ids", [[1, 2, 2, 3], [3, 1, 3]], ids=["adjacent", "unsorted"])
def test_duplicate_ids_are_named(ids):
    with pytest.raises(DuplicateIdError, match=r"duplicate id [23] at f row \d, f row \d"):
        check_unique_ids([("f", pa.array(ids, pa.int64()))])


def test_ids_across_parts_and_sliced_arrays():
    ids = pa.array(np.arange(100, dtype=np.int64))
    check_unique_ids([("a", ids.slice(0, 50)), ("b", ids.slice(50))])
    with pytest.raises(DuplicateIdError, match="duplicate id 40 at a row 40, b row 0"):
        check_unique_ids([("a", ids.slice(0, 50)), ("b", ids.slice(40, 10))])
    with pytest.raises(DuplicateIdError, match="duplicate id 'x'"):
        check_unique_ids([("a", pa.array(["x", "y"])), ("b", pa.array(["x"]))])
