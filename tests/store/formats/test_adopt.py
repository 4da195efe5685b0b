"""`raycompat adopt`: an existing Parquet table published as a version in place (issue 15, item 3).

Real Parquet files, a real local Ray (``ray_local``: scans are Ray tasks, duplicates are found by
Ray Data's groupby in ``cluster/pipelines/unique.py``), a real moto S3 server, the CLI in a
subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raycompat.cluster.pipelines.inputs import iter_chunk_batches, plan_version_chunks
from raycompat.errors import ChangedFileError, PublishConflictError
from raycompat.index.version_index import build_version_index, load_version_index
from raycompat.serving.serving_map import serving_map
from raycompat.store import (
    CorruptFileError,
    DuplicateIdError,
    GalleryStore,
    SchemaError,
    StoreError,
    VersionInfo,
    embedding_table,
)
from raycompat.store.catalog.models import Catalog
from raycompat.store.commit.part_record import IdFingerprint
from raycompat.store.maintenance.gc import collect, plan_gc
from raycompat.store.read.vectors import vectors

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_data(ray_local):
    """The session's Ray, with Ray Data's task-based sort shuffle for groupby: on a 2-core
    machine it takes ~1-3 s on these tiny tables, where the default hash shuffle starts 200
    aggregator partitions (~20 s). The check itself is the same."""
    from ray.data import DataContext
    from ray.data.context import ShuffleStrategy

    context = DataContext.get_current()
    before = context.shuffle_strategy
    context.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    yield ray_local
    context.shuffle_strategy = before


def adopt(store, uri, version="v1", **kwargs):
    from raycompat.cluster.pipelines.adopt import adopt_version

    return adopt_version(
        store, "faces", version, str(uri), model=kwargs.pop("model", "ext"), **kwargs
    )


def rows(n: int, width: int = 4, seed: int = 0, unit: bool = False) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, width)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True) if unit else x


def write(
    path,
    ids,
    x,
    *,
    id_column="id",
    embedding_column="embedding",
    variable=False,
    dtype=None,
    **extra,
) -> pa.Table:
    """A Parquet file of ``ids`` and vectors ``x``: fixed-size or variable lists of ``dtype``
    (default float32)."""
    dtype = dtype or pa.float32()
    values = [None if v is None else list(v) for v in x]
    vector = pa.array(values, pa.list_(dtype) if variable else pa.list_(dtype, len(x[0])))
    table = pa.table({id_column: pa.array(ids), embedding_column: vector, **extra})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)
    return table


def published(store: GalleryStore) -> list[str]:
    return [v.version for v in store.versions("faces")]


def snapshot(folder) -> dict[str, bytes]:
    out = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(parent, name), "rb") as handle:
                out[os.path.join(parent, name)] = handle.read()
    return out


def test_a_folder_of_files_is_read_back_equal_everywhere_versions_are_read(tmp_path, ray_data):
    table = tmp_path / "table"
    ids = np.random.default_rng(1).permutation(90).astype(np.int64)  # unsorted: grouped by Ray
    x = rows(90)
    parts = [
        write(f"{table}/a.parquet", ids[:30], x[:30], label=pa.array(ids[:30] % 3)),
        write(f"{table}/b.parquet", ids[30:60], x[30:60], label=pa.array(ids[30:60] % 3)),
        write(f"{table}/day=2/c.parquet", ids[60:], x[60:], label=pa.array(ids[60:] % 3)),
    ]
    (table / "_SUCCESS").write_bytes(b"")  # what Spark leaves: not a part
    before = snapshot(table)
    store = GalleryStore(str(tmp_path / "store"))

    info = adopt(store, table, model="ext-4d")

    assert (info.rows, info.width, info.dtype, info.normalized) == (90, 4, "float32", False)
    assert info.files == ["a.parquet", "b.parquet", "day=2/c.parquet"]
    assert info.ids == IdFingerprint.of(pa.array(ids)).to_dict()
    pins = info.external["pins"]
    assert [p["bytes"] for p in pins] == [os.path.getsize(f"{table}/{f}") for f in info.files]
    assert all(p["mtime_ns"] and p["etag"] is None for p in pins)
    read = store.read("faces", "v1")
    assert read.equals(pa.concat_tables(parts))  # files in record order, columns as stored
    assert sum(b.num_rows for b in store.iter_batches("faces", "v1", 16, ["id"])) == 90
    # the transform's source: chunks planned from footers, streamed in actors
    chunks, id_type, carried = plan_version_chunks(store, "faces", info, rows_per_file=1000)
    streamed = [b for c in chunks for b in iter_chunk_batches(store, c, info, 64)]
    assert (len(chunks), id_type, [f.name for f in carried]) == (3, "int64", ["label"])
    assert np.array_equal(np.concatenate([vectors(b, "embedding") for b in streamed]), x)
    build_version_index(store, "faces", "v1", use_gpu=False)
    _, found = load_version_index(store, "faces", "v1").search(x[:5], k=1)
    assert found[:, 0].tolist() == ids[:5].tolist()
    # in place: nothing copied, the table untouched; the model registered and granted
    assert not [
        f for f in snapshot(tmp_path / "store") if f.endswith(".parquet") and "_index" not in f
    ]
    assert snapshot(table) == before
    catalog = Catalog(store)
    assert catalog.model("ext-4d").embed_dim == 4
    assert catalog.queryable_version("faces", "ext-4d").relation == "extracted"
    with pytest.raises(PublishConflictError, match="already has version 'v1'"):
        adopt(store, table, model="other")
    with pytest.raises(StoreError, match="inside the store's own folders"):
        adopt(store, store.path("faces", "_data"), "v2", model="other")


def test_float16_variable_lists_under_other_column_names(tmp_path, ray_data):
    x = rows(40, width=6, unit=True).astype(np.float16)
    for k in range(2):
        ids = [f"img-{k}-{i:02d}" for i in range(20)]  # sorted, disjoint: no groupby needed
        write(
            f"{tmp_path}/t/{k}.parquet",
            ids,
            x[20 * k : 20 * k + 20],
            id_column="image_id",
            embedding_column="vec",
            variable=True,
            dtype=pa.float16(),
        )
    store = GalleryStore(str(tmp_path / "store"))

    info = adopt(store, tmp_path / "t", id_column="image_id", embedding_column="vec")

    assert (info.rows, info.width, info.dtype, info.normalized) == (40, 6, "float16", True)
    assert info.external["id_column"] == "image_id"
    read = store.read("faces", "v1")
    assert read.schema.field("embedding").type == pa.list_(pa.float16(), 6)
    assert read.column_names == ["id", "embedding"]
    assert read.column("id")[0].as_py() == "img-0-00"
    assert np.array_equal(vectors(read, "embedding"), x.astype(np.float32))  # float32 compute
    batch = next(store.iter_batches("faces", "v1", columns=["embedding"]))
    assert batch.column_names == ["embedding"]


def _bad_width(d):
    write(f"{d}/a.parquet", ["a0", "a1"], rows(2), variable=True)
    write(f"{d}/b.parquet", ["b0", "b1"], [rows(1)[0], rows(1, 3)[0]], variable=True)


def _widths_differ(d):
    write(f"{d}/a.parquet", ["a0"], rows(1))
    write(f"{d}/b.parquet", ["b0"], rows(1, 3))


def _nan(d):
    x = rows(3)
    x[2, 1] = np.nan
    write(f"{d}/a.parquet", ["a0"], rows(1))
    write(f"{d}/b.parquet", ["b0", "b1", "b2"], x)


def _null_id(d):
    write(f"{d}/a.parquet", ["a0"], rows(1))
    write(f"{d}/b.parquet", ["b0", None], rows(2))


def _null_embedding(d):
    write(f"{d}/a.parquet", ["a0"], rows(1))
    write(f"{d}/b.parquet", ["b0", "b1"], [None, rows(1)[0]], variable=True)


def _duplicate(d):
    write(f"{d}/a.parquet", ["a0", "dup", "z9"], rows(3))
    write(f"{d}/b.parquet", ["b0", "dup"], rows(2))


def _missing_column(d):
    write(f"{d}/a.parquet", ["a0"], rows(1))
    write(f"{d}/b.parquet", ["b0"], rows(1), embedding_column="features")


def _corrupt(d):
    write(f"{d}/a.parquet", ["a0"], rows(1))
    with open(f"{d}/b.parquet", "wb") as handle:
        handle.write(b"PAR1 this is not a Parquet file")


def _empty(d):
    os.makedirs(d)
    with open(f"{d}/notes.txt", "w") as handle:
        handle.write("no parquet here")


BAD = {
    "wrong width": (_bad_width, SchemaError, r"b\.parquet: row 1 \(id 'b1'\) has 3 values"),
    "widths differ": (_widths_differ, SchemaError, r"b\.parquet has embedding width 3 .*a\.parq"),
    "NaN": (_nan, SchemaError, r"b\.parquet: 1 row\(s\) of embedding hold NaN/inf; first is row 2"),
    "null id": (_null_id, SchemaError, r"b\.parquet: row 1 has a null id"),
    "null embedding": (_null_embedding, SchemaError, r"b\.parquet: row 0 has a null embedding"),
    "duplicate id": (_duplicate, DuplicateIdError, r"duplicate id 'dup' .*a\.parquet, .*b\.parq"),
    "missing column": (_missing_column, SchemaError, r"b\.parquet: no column 'embedding'"),
    "corrupt file": (_corrupt, CorruptFileError, r"b\.parquet: not a readable Parquet file"),
    "empty folder": (_empty, StoreError, r"no Parquet files \(\*\.parquet\) to adopt"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_file_and_publishes_nothing(tmp_path, ray_data, case):
    make, error, message = BAD[case]
    make(str(tmp_path / "t"))
    before = snapshot(tmp_path / "t")
    store = GalleryStore(str(tmp_path / "store"))
    with pytest.raises(error, match=message):
        adopt(store, tmp_path / "t")
    assert not os.path.exists(store.path())  # no record, no model, no grant: untouched
    assert published(store) == []
    assert snapshot(tmp_path / "t") == before


def test_reading_a_pinned_file_that_changed_or_vanished_fails_naming_it(tmp_path, ray_data):
    for k in range(2):
        write(f"{tmp_path}/t/{k}.parquet", [10 * k, 10 * k + 1], rows(2, seed=k))
    store = GalleryStore(str(tmp_path / "store"))
    adopt(store, tmp_path / "t")
    first = f"{tmp_path}/t/0.parquet"
    stat = os.stat(first)

    os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched, same bytes
    with pytest.raises(ChangedFileError, match=r"t/0\.parquet: .* changed .*mtime_ns"):
        store.read("faces", "v1")
    with pytest.raises(ChangedFileError, match=r"t/0\.parquet"):
        list(store.iter_batches("faces", "v1"))
    with pytest.raises(ChangedFileError, match=r"t/0\.parquet"):
        build_version_index(store, "faces", "v1", use_gpu=False)
    os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert store.read("faces", "v1").num_rows == 4  # the pin is the file as it was

    write(f"{tmp_path}/t/1.parquet", [10, 11, 12], rows(3))  # rewritten: other bytes
    with pytest.raises(ChangedFileError, match=r"t/1\.parquet: .* changed .*bytes"):
        store.read("faces", "v1")
    os.remove(f"{tmp_path}/t/1.parquet")
    with pytest.raises(ChangedFileError, match=r"t/1\.parquet: .* is gone"):
        store.read("faces", "v1")


def test_an_s3_prefix_is_adopted_and_pinned_by_etag(s3_bucket, ray_data):
    import s3fs

    bucket, options = s3_bucket
    fs = s3fs.S3FileSystem(**options)
    x = rows(30)
    for k in range(3):
        table = embedding_table(np.arange(10 * k, 10 * k + 10), x[10 * k : 10 * k + 10])
        with fs.open(f"{bucket}/tables/faces/part-{k}.parquet", "wb") as handle:
            pq.write_table(table, handle)
    store = GalleryStore(f"s3://{bucket}/stores/main", options)

    info = adopt(store, f"s3://{bucket}/tables/faces/")

    assert info.external["root"] == f"s3://{bucket}/tables/faces"
    assert all(p["etag"] and p["mtime_ns"] is None for p in info.external["pins"])
    assert np.array_equal(vectors(store.read("faces", "v1"), "embedding"), x)
    assert fs.find(f"{bucket}/stores/main/faces/_data") == []  # nothing copied
    with pytest.raises(StoreError, match="adopts only s3 tables"):
        adopt(store, "/tmp/a-local-folder", "v2", model="other")
    # the same number of bytes, other content: only the ETag tells
    path = f"{bucket}/tables/faces/part-1.parquet"
    data = bytearray(fs.cat(path))
    data[4] ^= 0xFF  # a byte of the first data page (the footer stays readable)
    fs.pipe_file(path, bytes(data))
    with pytest.raises(ChangedFileError, match=r"s3://.*/part-1\.parquet: .* changed .*etag"):
        store.read("faces", "v1")


@pytest.mark.slow
def test_cli_adopts_a_table_and_fails_with_one_line(tmp_path, ray_data, capsys):
    from raycompat.cli.app import main

    for k in range(2):
        write(f"{tmp_path}/t/{k}.parquet", [f"r{k}{i}" for i in range(5)], rows(5, seed=k))
    x = rows(3)
    x[1, 0] = np.inf
    write(f"{tmp_path}/bad/x.parquet", ["a", "b", "c"], x)
    np.save(tmp_path / "q.npy", rows(5, seed=1)[:2])
    root = str(tmp_path / "store")
    env = {**os.environ, "RAY_ADDRESS": ray_data.get_runtime_context().gcs_address}

    def cli(*argv):  # a fresh process, as a user runs it, on the session's Ray cluster
        done = subprocess.run(
            [sys.executable, "-m", "raycompat.cli.app", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        return done.returncode, done.stdout, done.stderr.strip().splitlines()

    base = ["--store", root, "--model", "ext"]
    table, bad = str(tmp_path / "t"), str(tmp_path / "bad")
    code, out, err = cli("adopt", "faces", table, *base, "--version", "v1")
    assert code == 0, err
    assert "as gallery faces version v1: 10 rows in 2 file(s), 4-d float32" in out
    code, _, err = cli("adopt", "faces", table, *base[:-1], "other", "--version", "v1")
    assert code == 1 and len(err) == 1  # before Ray
    assert err[0].startswith(
        "raycompat: error: gallery 'faces' already has version 'v1', which "
        "is not this adoption (model 'ext', now 'other')"
    )

    capsys.readouterr()  # the same main() in this process, on the session's Ray
    assert main(["adopt", "faces", table, *base, "--version", "v1"]) == 0  # a rerun: no-op
    assert "as gallery faces version v1" in capsys.readouterr().out
    assert main(["adopt", "faces", bad, *base[:-1], "other", "--version", "v2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("raycompat: error: ") and "Traceback" not in "\n".join(err)
    assert "bad/x.parquet: 1 row(s) of embedding hold NaN/inf; first is row 1" in err[-1]
    with pytest.raises(SystemExit) as usage:
        main(["adopt", "faces", str(tmp_path / "t"), "--store", root])
    assert usage.value.code == 2 and "required" in capsys.readouterr().err
    assert (
        main(
            [
                "search",
                "faces",
                "--store",
                root,
                "--model",
                "ext",
                "--vectors",
                str(tmp_path / "q.npy"),
                "-k",
                "1",
                "--json",
            ]
        )
        == 0
    )
    results = json.loads(capsys.readouterr().out)["results"]
    assert [r["ids"] for r in results] == [["r10"], ["r11"]]  # searched with the adopted rows
    assert [v.version for v in GalleryStore(root).versions("faces")] == ["v1"]


def test_gc_never_deletes_adopted_files(tmp_path, ray_data):
    write(f"{tmp_path}/t/0.parquet", [0, 1, 2], rows(3))
    store = GalleryStore(str(tmp_path / "store"), lease_timeout_s=1, retention_s=4)
    adopt(store, tmp_path / "t")
    staging = store.begin("faces", VersionInfo("v2", "m2", 4, False, "v2 = extract(m2)"), "j")
    staging.write_table(embedding_table([5, 6], rows(2)), "p.parquet")
    staging.commit()
    before = snapshot(tmp_path / "t")
    then = time.time() - 60  # v1's record is older than the retention
    os.utime(store.path("faces", "_versions", "v1.json"), (then, then))

    served = partial(serving_map, store)  # what raycompat gc hands gc
    assert plan_gc(store, keep_versions=1, served=served) == []  # v1 is the model's grant
    os.remove(store.path("faces", "_queries", "ext.json"))  # the model no longer queries v1
    items = plan_gc(store, keep_versions=1, served=served)
    assert [(i.kind, i.path) for i in items] == [
        ("version", store.path("faces", "_versions", "v1.json"))
    ]
    collect(store, items)
    assert published(store) == ["v2"]
    assert snapshot(tmp_path / "t") == before


def test_the_upgrade_job_reads_the_test_rows_of_an_adopted_gallery(tmp_path, ray_data):
    """An adopted table as the gallery an upgrade is judged against: the stored rows of the
    test ids come back through the pin check and the renamed, variable-list columns."""
    from raycompat.cluster.upgrade.steps import version_rows

    x = rows(30, width=5)
    for k in range(2):
        ids = np.arange(15 * k, 15 * k + 15, dtype=np.int64)
        write(
            f"{tmp_path}/t/{k}.parquet",
            ids,
            x[15 * k : 15 * k + 15],
            id_column="row",
            embedding_column="vec",
            variable=True,
        )
    store = GalleryStore(str(tmp_path / "store"))
    adopt(store, tmp_path / "t", id_column="row", embedding_column="vec")
    wanted = np.array([29, 3, 17])
    np.testing.assert_array_equal(version_rows(store, "faces", "v1", wanted), x[wanted])
    assert version_rows(store, "faces", "v1", np.array([3, 99])) is None  # 99 is not stored
