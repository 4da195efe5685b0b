"""raycompat.index.mapped_ids: row -> id lookups from a memory-mapped Arrow file."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raycompat.index.mapped_ids import MappedIds


def write_ids(path, ids: list, batch_rows: int, type: pa.DataType | None = None) -> MappedIds:
    array = pa.array(ids, type)
    schema = pa.schema([pa.field("id", array.type)])
    with pa.ipc.new_file(str(path), schema) as writer:
        for start in range(0, len(ids), batch_rows):
            writer.write_batch(pa.record_batch([array[start : start + batch_rows]], schema=schema))
    return MappedIds(path)


@pytest.mark.parametrize("batch_rows", [1000, 7])  # one batch (the NumPy view), several
@pytest.mark.parametrize("kind", ["int64", "int32", "string"])  # int32: batch by batch
def test_lookups_equal_a_plain_array_for_any_shape(tmp_path, kind, batch_rows):
    values = np.random.default_rng(0).permutation(50) * 3 - 40  # int64 ids, -1 among them
    ids = values.tolist() if kind != "string" else [f"id{v}" for v in values]
    mapped = write_ids(
        tmp_path / "ids.arrow", ids, batch_rows, pa.int32() if kind == "int32" else None
    )
    plain = np.array(ids, dtype=np.int64 if kind != "string" else object)
    # several batches of int64 ids: one gather over the mapped file
    assert (mapped._shift is not None) == (kind == "int64" and batch_rows == 7)
    for shape in [(4, 10), (20, 10)]:  # a few rows (found one by one), many (in NumPy)
        rows = np.random.default_rng(1).integers(0, 50, size=shape)
        got = mapped[rows]
        assert got.dtype == mapped.dtype == plain.dtype and got.shape == shape
        np.testing.assert_array_equal(got, plain[rows])
    assert mapped[np.zeros((1, 0), np.int64)].shape == (1, 0)
    for outside, seen in (
        ([0, 50], "0..50"),
        ([-1, 3], "-1..3"),
        ([*range(49), *range(49), 50], "0..50"),
    ):
        with pytest.raises(IndexError, match=rf"row numbers must be in \[0, 50\), got {seen}$"):
            mapped[np.array(outside)]
