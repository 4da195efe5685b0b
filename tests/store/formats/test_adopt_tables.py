"""`raycompat adopt` of Delta Lake and Iceberg tables (issue 26): a snapshot's files, read through
the formats' own libraries, never a folder listing that resurrects deleted rows.

Real tables written by ``deltalake`` and by ``pyiceberg`` (SqlCatalog on SQLite), on local disk
and on the moto S3 server; the scans run on the session's local Ray (``ray_local``).
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest

from raycompat.errors import ChangedFileError
from raycompat.index.version_index import build_version_index, load_version_index
from raycompat.store import CorruptFileError, GalleryStore, StoreError, VersionInfo
from raycompat.store.formats.adopt import plan_adoption
from raycompat.store.formats.snapshot import UnsupportedTableError

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.ray
WIDTH = 4


def frame(lo: int, hi: int, seed: int = 0) -> pa.Table:
    """Rows ``lo..hi-1``: int64 ids and float32 vectors (variable lists, as Spark writes)."""
    x = np.random.default_rng(seed + lo).normal(size=(hi - lo, WIDTH)).astype(np.float32)
    return pa.table(
        {
            "id": pa.array(np.arange(lo, hi), pa.int64()),
            "embedding": pa.array(list(x), pa.list_(pa.float32())),
        }
    )


def adopt(store, uri, version="v1", model="ext", **kwargs):
    from raycompat.cluster.pipelines.adopt import adopt_version

    return adopt_version(store, "faces", version, str(uri), model=model, **kwargs)


def ids_of(store: GalleryStore, version: str = "v1") -> list[int]:
    return sorted(store.read("faces", version).column("id").to_pylist())


def test_a_delta_delete_is_not_resurrected_and_as_of_reads_an_older_version(tmp_path, ray_local):
    table = str(tmp_path / "faces")
    deltalake.write_deltalake(table, frame(0, 1000))
    deltalake.write_deltalake(table, frame(1000, 2000), mode="append")
    deltalake.DeltaTable(table).delete("id < 1000")  # an erasure request: version 2
    store = GalleryStore(str(tmp_path / "store"))

    info = adopt(store, table)

    assert (info.rows, len(info.files), info.width) == (1000, 1, WIDTH)
    assert info.external["table"] == {"format": "delta", "version": 2}
    assert info.lineage == f"v1 = adopt(delta:{table}@2)"
    assert ids_of(store) == list(range(1000, 2000))
    build_version_index(store, "faces", "v1", use_gpu=False)
    deleted, kept = frame(0, 1000).column("embedding"), frame(1000, 2000).column("embedding")
    queries = np.array([deleted[5].as_py(), kept[500].as_py()], np.float32)
    _, found = load_version_index(store, "faces", "v1").search(queries, k=10)
    assert found.min() >= 1000 and found[1, 0] == 1500  # id 5 is gone, 1500 found
    # --as-of: the version before the delete, by number and by its commit's timestamp
    older = adopt(store, table, "v0", model="ext-v0", as_of="1")
    assert (older.rows, older.external["table"]) == (2000, {"format": "delta", "version": 1})
    assert ids_of(store, "v0") == list(range(2000))
    when = deltalake.DeltaTable(table).history()[1]["timestamp"]  # version 1, newest first
    stamp = datetime.fromtimestamp(when / 1000, UTC).isoformat()
    plan = plan_adoption(store, "faces", "v00", table, model="ext-v00", as_of=stamp)
    assert plan.table == {"format": "delta", "version": 1} and len(plan.files) == 2
    with pytest.raises(StoreError, match=r"could not be read as of 7: .*version 7"):
        plan_adoption(store, "faces", "v7", table, model="m7", as_of="7")


def test_a_delta_overwrite_is_adopted_without_a_spurious_duplicate(tmp_path, ray_local):
    table = str(tmp_path / "faces")
    deltalake.write_deltalake(table, frame(0, 300))
    deltalake.write_deltalake(table, frame(0, 300, seed=7), mode="overwrite")
    store = GalleryStore(str(tmp_path / "store"))

    info = adopt(store, table)

    assert (info.rows, len(info.files), info.external["table"]["version"]) == (300, 1, 1)
    read = store.read("faces", "v1")
    overwritten = frame(0, 300, seed=7).column("embedding")
    assert read.column("embedding")[0].as_py() == overwritten[0].as_py()
    assert len([f for f in os.listdir(table) if f.endswith(".parquet")]) == 2  # both still there
    raw = json.loads(info.to_json())  # the record's table identity is schema-checked on read
    raw["external"]["table"]["version"] = "1"
    with pytest.raises(CorruptFileError, match=r"v1\.json: .*'table' must hold 'format'"):
        VersionInfo.from_json(json.dumps(raw).encode(), "v1.json")


def test_compaction_and_vacuum_after_adoption_fail_the_read(tmp_path, ray_local):
    table = str(tmp_path / "faces")
    deltalake.write_deltalake(table, frame(0, 100))
    deltalake.write_deltalake(table, frame(100, 200), mode="append")
    store = GalleryStore(str(tmp_path / "store"))
    assert adopt(store, table).rows == 200

    source = deltalake.DeltaTable(table)
    source.optimize.compact()
    source.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    with pytest.raises(ChangedFileError, match=r"faces/part-.*\.parquet: .* is gone"):
        store.read("faces", "v1")
    again = plan_adoption(store, "faces", "v2", table, model="ext-2")  # the compacted snapshot
    assert len(again.files) == 1 and again.table["version"] > 1  # after the compaction


def write_deletion_vector(table: str) -> None:
    """Commit a deletion vector (rows 0 and 1 of the table's one file) by hand, as Spark or
    Databricks would: deltalake rewrites files on delete, it writes no deletion vectors. The
    vector file's layout is Delta's PROTOCOL.md ("Deletion Vector Format")."""
    from pyroaring import BitMap

    add = pa.table(deltalake.DeltaTable(table).get_add_actions(flatten=True)).to_pylist()[0]
    bitmap = struct.pack("<iQI", 1681511377, 1, 0) + BitMap([0, 1]).serialize()
    os.makedirs(f"{table}/ab")  # "ab" + z85 of the uuid below: the descriptor's pathOrInlineDv
    with open(f"{table}/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin", "wb") as f:
        f.write(
            b"\x01"
            + struct.pack(">i", len(bitmap))
            + bitmap
            + struct.pack(">I", zlib.crc32(bitmap))
        )
    vector = {
        "storageType": "u",
        "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
        "offset": 1,
        "sizeInBytes": len(bitmap),
        "cardinality": 2,
    }
    now = int(time.time() * 1000)
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "DELETE"}},
        {"remove": {"path": add["path"], "deletionTimestamp": now, "dataChange": True}},
        {
            "add": {
                "path": add["path"],
                "size": add["size_bytes"],
                "partitionValues": {},
                "modificationTime": add["modification_time"],
                "dataChange": True,
                "stats": json.dumps({"numRecords": 100}),
                "deletionVector": vector,
            }
        },
    ]
    with open(f"{table}/_delta_log/{1:020d}.json", "w") as log:
        log.write("\n".join(json.dumps(a) for a in actions) + "\n")


def test_delta_deletion_vectors_are_refused(tmp_path):
    table = str(tmp_path / "faces")
    deltalake.write_deltalake(
        table, frame(0, 100), configuration={"delta.enableDeletionVectors": "true"}
    )
    store = GalleryStore(str(tmp_path / "store"))
    assert plan_adoption(store, "faces", "v0", table, model="m").table["version"] == 0
    write_deletion_vector(table)
    assert deltalake.DeltaTable(table).version() == 1  # a valid table to its own library

    with pytest.raises(
        UnsupportedTableError,
        match=r"version 1 of this Delta table has deletion "
        r"vectors \(.*faces/part-.*\.parquet\)",
    ):
        plan_adoption(store, "faces", "v1", table, model="m")


@pytest.mark.parametrize("marker, name", [(".hoodie", "Hudi"), ("_versions", "Lance")])
def test_unsupported_formats_are_refused_in_one_line(tmp_path, marker, name, capsys):
    from raycompat.cli.app import main

    table = tmp_path / "faces"
    (table / marker).mkdir(parents=True)
    frame(0, 10).to_pandas().to_parquet(table / "part-0.parquet")
    argv = [
        "adopt",
        "faces",
        str(table),
        "--store",
        str(tmp_path / "store"),
        "--version",
        "v1",
        "--model",
        "m",
    ]

    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"raycompat: error: {table} is a {name} table, which adopt does not read (its "
        f"Parquet files may hold deleted or superseded rows); export it to Parquet or "
        f"Delta first and adopt that"
    ]
    os.rename(table / marker, table / "other")  # now a plain Parquet folder: --as-of is refused
    assert main([*argv, "--as-of", "3"]) == 1
    assert "--as-of applies to Delta and Iceberg tables" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main([*argv, "--as-of", "yesterday"])
    assert usage.value.code == 2 and "neither a version" in capsys.readouterr().err


def test_a_delta_table_on_s3_is_adopted_from_its_snapshot(s3_bucket, ray_local):
    from raycompat.store.formats.adopt_delta import delta_storage_options

    bucket, options = s3_bucket
    table = f"s3://{bucket}/tables/faces"
    writer = {
        **delta_storage_options(options),
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
        "AWS_REGION": "us-east-1",
    }
    deltalake.write_deltalake(table, frame(0, 100), storage_options=writer)
    deltalake.write_deltalake(table, frame(100, 200), mode="append", storage_options=writer)
    deltalake.DeltaTable(table, storage_options=writer).delete("id < 100")
    store = GalleryStore(f"s3://{bucket}/stores/main", options)

    info = adopt(store, table)

    assert (info.rows, info.external["table"]) == (100, {"format": "delta", "version": 2})
    assert all(p["etag"] and p["mtime_ns"] is None for p in info.external["pins"])
    assert ids_of(store) == list(range(100, 200))


def iceberg_table(tmp_path, catalog_name="local"):
    """An Iceberg table in ``tmp_path/warehouse`` through a SQL catalog on SQLite."""
    pytest.importorskip("pyiceberg")
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        catalog_name,
        uri=f"sqlite:///{tmp_path}/catalog.db",
        warehouse=f"file://{tmp_path}/warehouse",
    )
    catalog.create_namespace("gallery")
    return catalog.create_table("gallery.faces", schema=frame(0, 1).schema)


def test_an_iceberg_snapshot_is_adopted_with_its_delete_applied(tmp_path, ray_local):
    source = iceberg_table(tmp_path)
    source.append(frame(0, 100))
    first = source.current_snapshot().snapshot_id
    source.append(frame(100, 200))
    source.delete("id < 50")  # pyiceberg deletes copy-on-write: the snapshot's files hold 150
    snapshot = source.current_snapshot().snapshot_id
    root = source.location().removeprefix("file://")
    store = GalleryStore(str(tmp_path / "store"))

    info = adopt(store, root)

    assert (info.rows, info.external["table"]) == (150, {"format": "iceberg", "version": snapshot})
    assert info.lineage == f"v1 = adopt(iceberg:{root}@{snapshot})"
    assert ids_of(store) == list(range(50, 200))
    older = adopt(store, root, "v0", model="ext-v0", as_of=str(first))
    assert ids_of(store, "v0") == list(range(100)) and older.external["table"]["version"] == first


def test_iceberg_delete_files_are_refused(tmp_path):
    """A positional delete file (row 0 of the one data file), committed through pyiceberg, which
    itself deletes copy-on-write and writes no delete files (Spark's merge-on-read does)."""
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    source = iceberg_table(tmp_path)
    source.append(frame(0, 100))
    data = next(iter(source.scan().plan_files())).file
    path = f"{source.location().removeprefix('file://')}/data/deletes.parquet"
    pq.write_table(
        pa.table({"file_path": [data.file_path], "pos": pa.array([0], pa.int64())}), path
    )
    deletes = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=f"file://{path}",
        partition=Record(),
        file_format=FileFormat.PARQUET,
        record_count=1,
        file_size_in_bytes=os.path.getsize(path),
    )
    with source.transaction() as commit, commit.update_snapshot().fast_append() as append:
        append.append_data_file(deletes)
    root = source.location().removeprefix("file://")
    store = GalleryStore(str(tmp_path / "store"))

    with pytest.raises(
        UnsupportedTableError,
        match=r"snapshot \d+ of this Iceberg table has "
        r"delete files \(1 for file://.*/data/00000-.*\.parquet\)",
    ):
        plan_adoption(store, "faces", "v1", root, model="m")
    assert (
        len(
            plan_adoption(
                store, "faces", "v0", root, model="m", as_of=str(source.snapshots()[0].snapshot_id)
            ).files
        )
        == 1
    )  # the snapshot before the delete


def test_an_iceberg_table_on_s3_is_adopted_from_its_snapshot(tmp_path, s3_bucket, ray_local):
    from raycompat.store.formats.adopt_iceberg import iceberg_properties

    pytest.importorskip("pyiceberg")
    from pyiceberg.catalog.sql import SqlCatalog

    bucket, options = s3_bucket
    catalog = SqlCatalog(
        "s3",
        uri=f"sqlite:///{tmp_path}/catalog.db",
        warehouse=f"s3://{bucket}/warehouse",
        **iceberg_properties(options),
    )
    catalog.create_namespace("gallery")
    source = catalog.create_table("gallery.faces", schema=frame(0, 1).schema)
    source.append(frame(0, 100))
    source.append(frame(100, 200))
    source.delete("id >= 150")
    store = GalleryStore(f"s3://{bucket}/stores/main", options)

    info = adopt(store, source.location())

    assert info.external["root"] == f"s3://{bucket}/warehouse/gallery/faces"
    assert info.external["table"]["format"] == "iceberg"
    assert all(p["etag"] and p["mtime_ns"] is None for p in info.external["pins"])
    assert ids_of(store) == list(range(150))


def test_an_iceberg_table_is_adopted_by_its_catalog_name(tmp_path, ray_local, capsys):
    """``iceberg:<namespace>.<table>`` through the SQL catalog raycompat export writes: the
    catalog, not the newest metadata file, names the current snapshot."""
    from raycompat.cli.app import main

    source = iceberg_table(tmp_path, "raycompat")  # adopt_iceberg.CATALOG_NAME
    source.append(frame(0, 100))
    first = source.current_snapshot().snapshot_id
    source.append(frame(100, 200))
    source.delete("id < 50")
    snapshot = source.current_snapshot().snapshot_id
    root = source.location().removeprefix("file://")
    metadata = source.metadata_location.removeprefix("file://")  # an orphan of its version:
    with (
        open(metadata) as f,
        open(f"{metadata[: -len('.metadata.json')]}0.metadata.json", "w") as orphan,
    ):
        orphan.write(f.read())  # a folder is refused, the catalog knows the current one
    store = GalleryStore(str(tmp_path / "store"))
    with pytest.raises(UnsupportedTableError, match="only the table's catalog knows"):
        plan_adoption(store, "faces", "v1", root, model="ext")

    assert (
        main(
            [
                "adopt",
                "faces",
                "iceberg:gallery.faces",
                "--catalog-uri",
                f"sqlite:///{tmp_path}/catalog.db",
                "--warehouse",
                f"{tmp_path}/warehouse",
                "--store",
                str(tmp_path / "store"),
                "--version",
                "v1",
                "--model",
                "ext",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (out["uri"], out["root"], out["rows"]) == (
        f"iceberg:gallery.faces@{snapshot}",
        root,
        150,
    )
    info = store.version("faces", "v1")
    assert info.lineage == f"v1 = adopt(iceberg:gallery.faces@{snapshot})"
    assert info.external["table"] == {"format": "iceberg", "version": snapshot}
    assert ids_of(store) == list(range(50, 200))
    older = plan_adoption(
        store,
        "faces",
        "v0",
        "iceberg:gallery.faces",
        model="ext-v0",
        as_of=str(first),
        catalog_uri=f"sqlite:///{tmp_path}/catalog.db",
    )
    assert older.source == f"iceberg:gallery.faces@{first}" and len(older.files) == 1


def test_an_unknown_catalog_name_is_refused_in_one_line(tmp_path, capsys):
    from raycompat.cli.app import main

    iceberg_table(tmp_path, "raycompat")
    catalog = f"sqlite:///{tmp_path}/catalog.db"
    store = GalleryStore(str(tmp_path / "store"))
    with pytest.raises(
        StoreError,
        match=rf"catalog {catalog} \(catalog name 'raycompat'\) has no "
        r"table gallery\.nope; its tables: gallery\.faces$",
    ):
        plan_adoption(store, "faces", "v1", "iceberg:gallery.nope", model="m", catalog_uri=catalog)
    with pytest.raises(
        StoreError,
        match=r"has no namespace 'people' \(for table people\.faces"
        r"\); its namespaces: gallery$",
    ):
        plan_adoption(store, "faces", "v1", "iceberg:people.faces", model="m", catalog_uri=catalog)
    argv = [
        "--store",
        str(tmp_path / "store"),
        "--version",
        "v1",
        "--model",
        "m",
    ]
    assert (
        main(
            [
                "adopt",
                "faces",
                "iceberg:gallery.faces",
                "--catalog-uri",
                f"sqlite:///{tmp_path}/none.db",
                *argv,
            ]
        )
        == 1
    )  # never creates an empty one
    assert not (tmp_path / "none.db").exists()
    assert "no such SQLite file" in capsys.readouterr().err
    for usage in (["iceberg:gallery.faces"], [str(tmp_path), "--catalog-uri", catalog]):
        with pytest.raises(SystemExit) as exit_:
            main(["adopt", "faces", *usage, *argv])
        assert exit_.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
