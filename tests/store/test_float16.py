"""float16 storage of embeddings: half the bytes, read back as float32 (issue 15, item 4)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from raycompat.index.version_index import build_version_index, load_version_index
from raycompat.store import (
    GalleryStore,
    SchemaError,
    StoreError,
    VersionInfo,
    embedding_schema,
    embedding_table,
)
from raycompat.store.read.vectors import vectors
from tests.store.test_gallery import unit_rows


def publish(store, version, x, dtype, normalized=True):
    info = VersionInfo(version, "m", x.shape[1], normalized, f"{version} = t", dtype=dtype)
    staging = store.begin("g", info, "job")
    staging.write_table(embedding_table(np.arange(len(x)), x), "p.parquet")  # float32 rows
    return staging.commit(expected_rows=len(x))


def test_float16_version_stores_half_the_bytes_and_reads_back_as_float32(tmp_path):
    store = GalleryStore(str(tmp_path))
    x = unit_rows(2_000, 256)
    wide = publish(store, "v1", x, "float32")
    half = publish(store, "v2", x, "float16")
    size = {v.version: os.path.getsize(store.path("g", v.files[0])) for v in (wide, half)}
    assert 0.45 < size["v2"] / size["v1"] < 0.55  # the vectors dominate; ids are the rest
    assert size["v1"] < 1.05 * x.nbytes  # no dictionary page on random floats
    table = store.read("g", "v2")
    assert table.schema.field("embedding").type == pa.list_(pa.float16(), 256)
    assert store.version("g", "v2").dtype == "float16"
    got = vectors(table, "embedding")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, x.astype(np.float16).astype(np.float32))
    assert np.abs(got - x).max() < 1e-3  # float16 rounding of unit-norm coordinates


def test_float16_index_searches_as_float32(tmp_path):
    store = GalleryStore(str(tmp_path))
    x = unit_rows(300, 16)
    publish(store, "v1", x, "float16")
    build_version_index(store, "g", "v1", use_gpu=False)
    scores, ids = load_version_index(store, "g", "v1", use_gpu=False).search(x[[5, 7]], 1)
    assert ids[:, 0].tolist() == [5, 7]
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=2e-3)


def test_values_beyond_float16_range_are_refused_naming_the_row(tmp_path):
    store = GalleryStore(str(tmp_path))
    x = np.ones((4, 8), np.float32)
    x[2, 3] = 1e5  # float16's largest finite value is 65504
    with pytest.raises(SchemaError, match=r"hold NaN/inf; first is row 2"):
        publish(store, "v1", x, "float16", normalized=False)
    assert store.versions("g") == []


def test_float16_schema_and_bad_dtype():
    assert embedding_schema(8, dtype="float16").field("embedding").type.value_type == pa.float16()
    with pytest.raises(SchemaError, match="dtype must be one of"):
        embedding_schema(8, dtype="bfloat16")
    with pytest.raises(StoreError, match="dtype must be one of .*'int8'"):
        VersionInfo("v1", "m", 8, False, "v1 = t", dtype="int8")


def test_float32_file_in_a_float16_version_is_refused(tmp_path):
    """A part written outside the writers' cast (e.g. copied in) must match the version."""
    from raycompat.store.schema import validate_schema

    info = VersionInfo("v1", "m", 8, False, "v1 = t", dtype="float16")
    schema = embedding_schema(8, "int64")
    with pytest.raises(SchemaError, match=r"expected fixed_size_list<float16>\[8\]"):
        validate_schema(schema, info, "part.parquet")
