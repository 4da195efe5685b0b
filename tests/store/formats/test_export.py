"""`raycompat export` (issue 26, item 4): a published version written as a Delta or Iceberg
table that deltalake and pyiceberg read back without raycompat; float16 widened to float32.

Real tables on local disk and on the moto S3 server; no Ray except the adopt round trip.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute.field)
import pyarrow.parquet as pq
import pytest

from raycompat.errors import ManifestError
from raycompat.store import GalleryStore, StoreError, VersionInfo, embedding_table
from raycompat.store.formats.adopt_iceberg import CATALOG_NAME
from raycompat.store.formats.export import ExportOptionError, export_version
from raycompat.store.maintenance.no_space import NoSpaceError

RAY_WORKER_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\(\w+ pid=\d+(, ip=[0-9.]+)?\) ")

deltalake = pytest.importorskip("deltalake")
WIDTH = 4


def publish(store: GalleryStore, version: str, rows: int, dtype: str = "float32") -> np.ndarray:
    """Publish ``rows`` unit vectors (ids 0..rows-1, labels id % 3) in two files; returns them."""
    x = np.random.default_rng(rows).normal(size=(rows, WIDTH)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    info = VersionInfo(version, "m1", WIDTH, True, f"{version} = extract(m1)", dtype=dtype)
    staging = store.begin("faces", info, "job")
    half = rows // 2
    for name, part in (("a.parquet", slice(0, half)), ("b.parquet", slice(half, rows))):
        ids = np.arange(rows)[part]
        staging.write_table(embedding_table(ids, x[part], labels=ids % 3), name)
    staging.commit(expected_rows=rows)
    return x


def by_id(table: pa.Table) -> tuple[list[int], np.ndarray]:
    table = table.sort_by("id")
    vectors = np.array(table.column("embedding").to_pylist(), np.float32)
    return table.column("id").to_pylist(), vectors


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_version_exported_to_delta_reads_back_with_its_source_properties(tmp_path, dtype):
    store = GalleryStore(str(tmp_path / "store"))
    x = publish(store, "v1", 50, dtype)
    target = str(tmp_path / "tables" / "faces_v1")

    summary = export_version(store, "faces", "v1", "delta", target, batch_size=16)

    table = deltalake.DeltaTable(target)
    ids, vectors = by_id(table.to_pyarrow_table())
    assert ids == list(range(50)) and vectors.dtype == np.float32
    stored = x.astype(np.float16).astype(np.float32) if dtype == "float16" else x
    np.testing.assert_array_equal(vectors, stored)
    assert table.to_pyarrow_table().sort_by("id").column("label").to_pylist()[:4] == [0, 1, 2, 0]
    props = table.metadata().configuration
    record = store.version("faces", "v1")
    assert props["raycompat.source.gallery"] == "faces"
    assert props["raycompat.source.model_version"] == "m1"
    assert props["raycompat.source.rows"] == "50" and props["raycompat.source.dtype"] == dtype
    assert json.loads(props["raycompat.source.ids"]) == record.ids
    assert (summary.rows, summary.files, summary.dtype) == (50, len(table.file_uris()), dtype)
    widened = "float16 embeddings widened to float32 (Delta has no float16 type)"
    assert (widened in summary.line()) == (dtype == "float16")
    assert summary.line().startswith(f"exported faces v1: 50 rows in {summary.files} file(s)")


def test_an_existing_target_is_refused_unless_overwrite(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 20)
    publish(store, "v2", 30)
    target = str(tmp_path / "faces")
    export_version(store, "faces", "v1", "delta", target)

    with pytest.raises(StoreError, match=r"faces already holds a Delta table; --mode overwrite"):
        export_version(store, "faces", "v2", "delta", target)
    summary = export_version(store, "faces", "v2", "delta", target, mode="overwrite")

    table = deltalake.DeltaTable(target)
    assert table.to_pyarrow_table().num_rows == 30 == summary.rows
    assert table.metadata().configuration["raycompat.source.version"] == "v2"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match=r"other is a folder holding 1 entries and no Delta"):
        export_version(store, "faces", "v1", "delta", str(other), mode="overwrite")
    with pytest.raises(StoreError, match=r"is inside the store"):
        export_version(store, "faces", "v1", "delta", str(tmp_path / "store" / "out"))


def test_unknown_version_gallery_and_options_are_one_line_errors(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 10)
    target = str(tmp_path / "t")
    with pytest.raises(ManifestError, match=r"'faces' has no version 'v9'; it has \['v1'\]"):
        export_version(store, "faces", "v9", "delta", target)
    with pytest.raises(ManifestError, match=r"gallery 'cars' has no version 'v1'; it has \[\]"):
        export_version(store, "cars", "v1", "delta", target)
    with pytest.raises(ExportOptionError, match=r"--warehouse does not apply to --format delta"):
        export_version(store, "faces", "v1", "delta", target, warehouse="w")
    with pytest.raises(ExportOptionError, match=r"--format iceberg needs --catalog-uri"):
        export_version(store, "faces", "v1", "iceberg", "ns.t", warehouse="w")
    assert not (tmp_path / "t").exists()


def test_a_version_whose_files_differ_from_its_fingerprint_is_refused(tmp_path):
    """The ids streamed are checked against the record's fingerprint before the properties are
    written (a record edited by hand here, as a stand-in for a corrupt store)."""
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 10)
    path = tmp_path / "store" / "faces" / "_versions" / "v1.json"
    raw = json.loads(path.read_text())
    raw["ids"]["xor"] = "0"
    path.write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match=r"v1's record fingerprints its ids as .*; its files"):
        export_version(store, "faces", "v1", "delta", str(tmp_path / "t"))


def iceberg_options(tmp_path) -> dict:
    pytest.importorskip("pyiceberg")
    return {"catalog_uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": str(tmp_path / "wh")}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_version_exported_to_iceberg_reads_back_through_the_catalog(tmp_path, dtype):
    from pyiceberg.catalog.sql import SqlCatalog

    store = GalleryStore(str(tmp_path / "store"))
    x = publish(store, "v1", 40, dtype)
    options = iceberg_options(tmp_path)

    summary = export_version(store, "faces", "v1", "iceberg", "gallery.faces_v1", **options)

    catalog = SqlCatalog(CATALOG_NAME, uri=options["catalog_uri"], warehouse=options["warehouse"])
    table = catalog.load_table("gallery.faces_v1")
    ids, vectors = by_id(table.scan().to_arrow())
    assert ids == list(range(40))
    np.testing.assert_array_equal(vectors, x.astype(dtype).astype(np.float32))
    assert table.properties["raycompat.source.version"] == "v1"
    assert json.loads(table.properties["raycompat.source.ids"]) == store.version("faces", "v1").ids
    assert len(table.snapshots()) == 1 and summary.files >= 1
    assert ("(Iceberg has no float16 type)" in summary.line()) == (dtype == "float16")
    with pytest.raises(
        StoreError,
        match=r"already has the table gallery.faces_v1; export to a "
        r"new table name",
    ):
        export_version(store, "faces", "v1", "iceberg", "gallery.faces_v1", **options)


def test_a_failed_iceberg_export_leaves_no_table(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 10)
    second = store.version("faces", "v1").files[1]  # the first file is written, then this fails
    with open(store.path("faces", second), "r+b") as handle:
        handle.truncate(100)
    options = iceberg_options(tmp_path)
    with pytest.raises(StoreError, match=r"b\.parquet"):
        export_version(store, "faces", "v1", "iceberg", "gallery.t", **options)
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(CATALOG_NAME, uri=options["catalog_uri"], warehouse=options["warehouse"])
    assert not catalog.table_exists("gallery.t")
    assert not (tmp_path / "wh" / "gallery" / "t").exists()  # no metadata or data file left


def append_fails_after_a_file(monkeypatch, error: BaseException):
    """pyiceberg's append writes part of a data file, then raises ``error``; returns what puts
    the real append back, for the rerun."""
    from pyiceberg.table import Transaction

    append = Transaction.append

    def fails(self, reader, *args, **kwargs):
        data = Path(self.table_metadata.location) / "data"
        data.mkdir(parents=True)
        (data / "00000-0.parquet").write_bytes(b"PAR1 partial")
        raise error

    monkeypatch.setattr(Transaction, "append", fails)
    return lambda: monkeypatch.setattr(Transaction, "append", append)


def test_a_full_disk_under_an_iceberg_export_is_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    """pyiceberg's append writes a data file, then the disk is full (an ``OSError`` with
    ENOSPC, as pyarrow raises it): the table is dropped, its folder removed, one line; the
    same export then runs."""
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 12)
    options = iceberg_options(tmp_path)
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    restore = append_fails_after_a_file(monkeypatch, full)
    with pytest.raises(NoSpaceError) as raised:
        export_version(store, "faces", "v1", "iceberg", "gallery.t", **options)
    assert str(raised.value) == (
        "gallery.t: no space left on device; the Iceberg table was not written; the files "
        "this export wrote were removed"
    )
    assert not (tmp_path / "wh" / "gallery" / "t").exists()
    restore()
    assert export_version(store, "faces", "v1", "iceberg", "gallery.t", **options).rows == 12


def test_ctrl_c_under_an_iceberg_export_leaves_no_table_or_file_and_the_rerun_exports(
    tmp_path, monkeypatch
):
    """Ctrl-C while pyiceberg's append has written a data file (issue 52, item 6): the
    interrupt goes on up (the command's one line and exit 130), the table it created is
    dropped and its folder removed, so rerunning the same export writes the table."""
    from pyiceberg.catalog.sql import SqlCatalog

    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 12)
    options = iceberg_options(tmp_path)
    restore = append_fails_after_a_file(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        export_version(store, "faces", "v1", "iceberg", "gallery.t", **options)
    catalog = SqlCatalog(CATALOG_NAME, uri=options["catalog_uri"], warehouse=options["warehouse"])
    assert not catalog.table_exists("gallery.t")
    assert not (tmp_path / "wh" / "gallery" / "t").exists()
    restore()
    assert export_version(store, "faces", "v1", "iceberg", "gallery.t", **options).rows == 12


def test_an_iceberg_table_folder_holding_files_is_refused_and_kept(tmp_path):
    """A table dropped without purging left its files: the export refuses that folder (it
    removes its folder when it fails), and writes nothing."""
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 12)
    left = tmp_path / "wh" / "gallery" / "t" / "data" / "old.parquet"
    left.parent.mkdir(parents=True)
    left.write_bytes(b"another table's")
    with pytest.raises(StoreError) as refused:
        export_version(store, "faces", "v1", "iceberg", "gallery.t", **iceberg_options(tmp_path))
    assert str(refused.value) == (
        f"{tmp_path}/wh/gallery/t (the folder of the Iceberg table gallery.t) already holds 1 "
        "files; export to a new table name or empty that folder"
    )
    assert left.read_bytes() == b"another table's"


def test_the_cli_prints_one_line_or_json_and_exits_2_on_usage_errors(tmp_path, capsys):
    from raycompat.cli.app import main

    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 12, "float16")
    base = ["export", "faces", "--store", str(tmp_path / "store"), "--version", "v1"]

    assert main([*base, "--format", "delta", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("exported faces v1: 12 rows in 1 file(s) as the")
    assert out[0].endswith("float16 embeddings widened to float32 (Delta has no float16 type)")
    assert (
        main([*base, "--format", "delta", str(tmp_path / "t"), "--mode", "overwrite", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (out["rows"], out["dtype"], out["exported_dtype"]) == (12, "float16", "float32")
    assert main([*base, "--format", "delta", str(tmp_path / "t")]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as usage:  # as argparse's own usage errors do
        main([*base, "--format", "iceberg", "ns.t"])
    err = capsys.readouterr().err
    assert usage.value.code == 2
    assert err == "raycompat: error: --format iceberg needs --catalog-uri and --warehouse\n"
    assert main([*base[:3], str(tmp_path / "nowhere"), *base[4:], "--format", "delta", "t"]) == 2


def test_a_delta_export_to_s3_reads_back(s3_bucket):
    from raycompat.store.formats.adopt_delta import delta_storage_options

    bucket, options = s3_bucket
    store = GalleryStore(f"s3://{bucket}/stores/main", options)
    x = publish(store, "v1", 30)
    target = f"s3://{bucket}/tables/faces_v1"

    summary = export_version(store, "faces", "v1", "delta", target)

    table = deltalake.DeltaTable(target, storage_options=delta_storage_options(options))
    ids, vectors = by_id(table.to_pyarrow_table())
    assert ids == list(range(30)) and summary.files == len(table.file_uris())
    np.testing.assert_array_equal(vectors, x)
    assert table.metadata().configuration["raycompat.source.rows"] == "30"
    with pytest.raises(StoreError, match=r"faces_v1 already holds a Delta table"):
        export_version(store, "faces", "v1", "delta", target)


@pytest.mark.ray
def test_an_exported_delta_table_adopts_back_as_the_same_version(tmp_path, ray_local):
    from raycompat.cluster.pipelines.adopt import adopt_version

    store = GalleryStore(str(tmp_path / "store"))
    x = publish(store, "v1", 60, "float16")
    target = str(tmp_path / "faces_v1")
    export_version(store, "faces", "v1", "delta", target)

    info = adopt_version(store, "faces", "v2", target, model="m1-copy")

    assert (info.rows, info.width, info.ids) == (60, WIDTH, store.version("faces", "v1").ids)
    assert info.external["table"] == {"format": "delta", "version": 1}
    ids, vectors = by_id(store.read("faces", "v2"))
    assert ids == list(range(60))
    np.testing.assert_array_equal(vectors, x.astype(np.float16).astype(np.float32))


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    import sys

    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 10)
    monkeypatch.setitem(sys.modules, "deltalake", None)  # import deltalake raises ImportError
    with pytest.raises(
        StoreError,
        match=r"^exporting Delta tables needs the deltalake package: "
        r"pip install 'raycompat\[delta\]'$",
    ):
        export_version(store, "faces", "v1", "delta", str(tmp_path / "t"))


def test_a_version_of_an_s3_store_exports_to_a_local_folder(s3_bucket, tmp_path):
    bucket, options = s3_bucket
    store = GalleryStore(f"s3://{bucket}/stores/local-target", options)
    x = publish(store, "v1", 12)
    summary = export_version(store, "faces", "v1", "delta", str(tmp_path / "faces_v1"))
    ids, vectors = by_id(deltalake.DeltaTable(str(tmp_path / "faces_v1")).to_pyarrow_table())
    assert ids == list(range(12)) and summary.rows == 12
    np.testing.assert_array_equal(vectors, x)


def no_space_after(written: int):
    """``ParquetWriter.write_batch`` as on a disk that fills after ``written`` batches."""
    real = pq.ParquetWriter.write_batch
    calls = []

    def write_batch(self, batch, *args, **kwargs):
        calls.append(batch.num_rows)
        if len(calls) > written:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, batch, *args, **kwargs)

    return write_batch


def commit_fails(error: Exception):
    def commit(*args, **kwargs):
        raise error

    return commit


DELTA_NO_SPACE = "Generic LocalFileSystem error: Unable to copy data to file: No space left on "
DELTA_NO_SPACE += "device (os error 28)"


@pytest.mark.parametrize("where", ["data files", "commit"])
def test_a_full_disk_is_one_line_and_leaves_no_folder(tmp_path, capfd, monkeypatch, where):
    from deltalake import transaction

    from raycompat.cli.app import main

    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 12)
    if where == "data files":
        monkeypatch.setattr(pq.ParquetWriter, "write_batch", no_space_after(0))
    else:  # the commit's log entry, as delta-rs reports a full disk
        error = deltalake.exceptions.DeltaError(DELTA_NO_SPACE)
        monkeypatch.setattr(transaction, "create_table_with_add_actions", commit_fails(error))
    target = tmp_path / "out" / "t"
    argv = ["export", "faces", str(target), "--store", store.root, "--version", "v1"]
    assert main([*argv, "--format", "delta"]) == 1
    out, err = capfd.readouterr()
    # the test session's Ray (started by an earlier test) may forward a worker's late line,
    # "(PlacementGroupCleaner pid=...) ...", to this process's stderr: not the command's output
    ours = [line for line in err.splitlines() if not RAY_WORKER_LINE.match(line)]
    assert out == "" and ours == [
        f"raycompat: error: {target}: no space left on device; the Delta table was not "
        "written; the folder this export created was removed"
    ], err
    assert not target.exists() and (tmp_path / "out").is_dir()  # only what it created


@pytest.mark.parametrize("where", ["data files", "commit"])
def test_a_failed_write_into_an_existing_table_keeps_it(tmp_path, monkeypatch, where):
    """An overwrite that fails leaves the table's folder as it was: the files it wrote go,
    no commit naming them."""
    from deltalake import DeltaTable

    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 12)
    target = str(tmp_path / "t")
    export_version(store, "faces", "v1", "delta", target)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "t").rglob("*"))

    if where == "data files":
        monkeypatch.setattr(pq.ParquetWriter, "write_batch", no_space_after(2))
    else:
        error = deltalake.exceptions.DeltaError(DELTA_NO_SPACE)
        monkeypatch.setattr(DeltaTable, "create_write_transaction", commit_fails(error))
    written = r"t: no space left on device; the Delta table was not written$"
    with pytest.raises(StoreError, match=written):
        export_version(store, "faces", "v1", "delta", target, mode="overwrite", batch_size=4)
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "t").rglob("*")) == before
    assert deltalake.DeltaTable(target).to_pyarrow_table().num_rows == 12


def test_ctrl_c_after_the_commit_leaves_no_table_and_the_rerun_exports(tmp_path, monkeypatch):
    """Ctrl-C as the commit returns (the properties not set yet): the export did not finish, so
    the table it created goes, and rerunning the same export writes it (issue 52: a rerun was
    refused, the target already holding a Delta table)."""
    from deltalake import transaction

    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 12)
    target = str(tmp_path / "t")
    commit = transaction.create_table_with_add_actions

    def committed_then_ctrl_c(*args, **kwargs):
        commit(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(transaction, "create_table_with_add_actions", committed_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        export_version(store, "faces", "v1", "delta", target)
    assert not (tmp_path / "t").exists()
    monkeypatch.setattr(transaction, "create_table_with_add_actions", commit)
    assert export_version(store, "faces", "v1", "delta", target).rows == 12


def test_a_version_whose_ids_differ_from_its_record_commits_nothing(tmp_path):
    """The ids are checked against the record before the commit: no table is left."""
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 10)
    path = tmp_path / "store" / "faces" / "_versions" / "v1.json"
    raw = json.loads(path.read_text())
    raw["ids"]["count"] = 11
    path.write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match=r"its files hold"):
        export_version(store, "faces", "v1", "delta", str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_files_roll_by_size_and_carry_delta_statistics(tmp_path, monkeypatch):
    """A new data file once FILE_BYTES of Arrow data are in one (here: after every batch), each
    with its row count, null counts and the id range a reader prunes by (issue 54: the files
    are written here, not by delta-rs)."""
    from raycompat.store.formats import export_delta

    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 40)  # two files of 20 rows: batches of 8, 8 and 4 in each
    monkeypatch.setattr(export_delta, "FILE_BYTES", 1)
    target = str(tmp_path / "t")

    summary = export_version(store, "faces", "v1", "delta", target, batch_size=8)

    table = deltalake.DeltaTable(target)
    adds = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    spans = sorted(zip(adds["min.id"], adds["max.id"], adds["num_records"], strict=True))
    assert spans == [(0, 7, 8), (8, 15, 8), (16, 19, 4), (20, 27, 8), (28, 35, 8), (36, 39, 4)]
    assert summary.files == 6 and set(adds["null_count.embedding"]) == {0}
    pruned = table.to_pyarrow_dataset().to_table(filter=pa.compute.field("id") >= 30)
    assert sorted(pruned.column("id").to_pylist()) == list(range(30, 40))


def test_string_ids_get_their_range_and_labels_theirs(tmp_path):
    """Statistics keep min/max of number and string columns (ids of either kind, labels), and
    none of another column a version carries (a date here, which JSON has no form for)."""
    import datetime

    store = GalleryStore(str(tmp_path / "store"))
    x = np.eye(WIDTH, dtype=np.float32)[np.arange(6) % WIDTH]
    staging = store.begin("faces", VersionInfo("v1", "m1", WIDTH, True, "v1 = extract(m1)"), "j")
    ids = [f"face-{i}" for i in (3, 1, 4, 0, 5, 2)]
    rows = embedding_table(ids, x, labels=[7, 8, 9, 7, 8, 9])
    rows = rows.append_column("seen", pa.array([datetime.date(2026, 12, d) for d in range(1, 7)]))
    staging.write_table(rows, "a.parquet")
    staging.commit(expected_rows=6)
    export_version(store, "faces", "v1", "delta", str(tmp_path / "t"))

    table = deltalake.DeltaTable(str(tmp_path / "t"))
    (add,) = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert (add["min.id"], add["max.id"], add["min.label"], add["max.label"]) == (
        "face-0", "face-5", 7, 9,
    )  # fmt: skip
    assert (add.get("min.seen"), add["null_count.seen"]) == (None, 0)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == sorted(ids)
