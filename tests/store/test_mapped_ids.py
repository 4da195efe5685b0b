"""raycompat.store.mapped_ids: row -> id lookups from a memory-mapped Arrow file."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raycompat.store.mapped_ids import MappedIds


def write_ids(path, ids: list, batch_rows: int) -> MappedIds:
    array = pa.array(ids)
    schema = pa.schema([pa.field("id", array.type)])
    with pa.ipc.new_file(str(path), schema) as writer:
        for start in range(0, len(ids), batch_rows):
            writer.write_batch(pa.record_batch([array[start : start + batch_rows]], schema=schema))
    return MappedIds(path)


@pytest.mark.parametrize("batch_rows", [1000, 7])  # one batch (the NumPy view), several
@pytest.mark.parametrize("kind", ["int64", "string"])
def test_lookups_equal_a_plain_array_for_any_shape(tmp_path, kind, batch_rows):
    values = np.random.default_rng(0).permutation(50) * 3 - 40  # int64 ids, -1 among them
    ids = values.tolist() if kind == "int64" else [f"id{v}" for v in values]
    mapped = write_ids(tmp_path / "ids.arrow", ids, batch_rows)
    plain = np.array(ids, dtype=np.int64 if kind == "int64" else object)
    rows = np.random.default_rng(1).integers(0, 50, size=(4, 10))
    got = mapped[rows]
    assert got.dtype == mapped.dtype == plain.dtype and got.shape == (4, 10)
    np.testing.assert_array_equal(got, plain[rows])
    assert mapped[np.zeros((1, 0), np.int64)].shape == (1, 0)
    with pytest.raises(IndexError, match=r"row numbers must be in \[0, 50\), got 0\.\.50"):
        mapped[np.array([0, 50])]
