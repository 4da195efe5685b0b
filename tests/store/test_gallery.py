"""raycompat.store on local disk: round trips, validation errors, atomic and concurrent publish,
and the per-version faiss index (checked against brute force)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from raycompat.index.version_index import build_version_index, load_version_index
from raycompat.registry import UnknownNameError
from raycompat.store import (
    ChangedFileError,
    CorruptFileError,
    DuplicateIdError,
    GalleryStore,
    ManifestError,
    PublishConflictError,
    SchemaError,
    StoreError,
    UnsafePathError,
    VerificationError,
    VersionInfo,
    embedding_schema,
    embedding_table,
    validate_table,
)

WIDTH = 4


def unit_rows(n: int, width: int = WIDTH, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, width)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def info(version: str = "v1", width: int = WIDTH, normalized: bool = True, **kw) -> VersionInfo:
    return VersionInfo(
        version,
        f"model-{version}",
        width,
        normalized,
        f"{version} = extract(model-{version})",
        **kw,
    )


def publish(store: GalleryStore, gallery: str, version: str, ids, x, **kw) -> VersionInfo:
    staging = store.begin(gallery, info(version, x.shape[1], **kw))
    staging.write_table(embedding_table(ids, x), "part-00000.parquet")
    return staging.commit(expected_rows=len(ids))


@pytest.fixture
def store(tmp_path) -> GalleryStore:
    return GalleryStore(str(tmp_path / "store"))


def test_round_trip_two_parts_with_side_info_and_labels(store):
    x, side = unit_rows(10), unit_rows(10, 3, seed=1)
    ids, labels = np.arange(100, 110), np.arange(10) % 3
    version = info("v1", side_info_width=3)
    staging = store.begin("faces", version, "job-1")
    for part, rows in enumerate((slice(0, 6), slice(6, 10))):
        table = embedding_table(ids[rows], x[rows], side[rows], labels[rows])
        staging.write_table(table, f"part-{part}.parquet")
    assert [r.part for r in staging.parts()] == ["part-0.parquet", "part-1.parquet"]
    files = [r.file for r in staging.parts()]  # writer-unique names ending in the part's
    assert [f.split(".", 1)[1] for f in files] == ["part-0.parquet", "part-1.parquet"]
    published = staging.commit(expected_rows=10, expected_ids=pa.array(ids[::-1]))
    assert published.rows == 10 and published.created
    assert published.files == [f"_data/v1/job-1/{f}" for f in files]
    sizes = [os.path.getsize(p) for p in staging.files()]
    assert [e["bytes"] for e in published.file_info] == sizes
    assert all(len(e["sha256"]) == 64 for e in published.file_info)

    table = store.read("faces", "v1")
    assert table.column("id").to_pylist() == ids.tolist()
    got = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(10, WIDTH)
    np.testing.assert_array_equal(got, x)
    assert table.column("label").to_pylist() == labels.tolist()
    assert table.schema.metadata[b"raycompat.lineage"] == b"v1 = extract(model-v1)"
    batches = list(store.iter_batches("faces", "v1", batch_size=4, columns=["id"]))
    assert [b.num_rows for b in batches] == [4, 2, 4]
    assert [i for b in batches for i in b.column("id").to_pylist()] == ids.tolist()
    assert store.galleries() == ["faces"] and store.version("faces", "v1") == published


def test_versions_are_listed_oldest_first_and_string_ids_work(store):
    assert store.latest("faces") is None and store.galleries() == []
    publish(store, "faces", "v2", ["a", "b"], unit_rows(2))
    publish(store, "faces", "v10", ["a", "b", "c"], unit_rows(3))
    assert [v.version for v in store.versions("faces")] == ["v2", "v10"]
    assert store.latest("faces").version == "v10"
    assert store.read("faces", "v10", columns=["id"]).column("id").to_pylist() == ["a", "b", "c"]
    assert store.path("faces", "_versions") == os.path.join(store.root, "faces", "_versions")


def test_embedding_schema():
    schema = embedding_schema(8, "int64", side_info_width=2, with_label=True, metadata={"k": "v"})
    assert schema.names == ["id", "embedding", "side_info", "label"]
    assert schema.field("embedding").type == pa.list_(pa.float32(), 8)
    assert schema.metadata == {b"k": b"v"}
    with pytest.raises(SchemaError, match="id_type"):
        embedding_schema(8, "float")


# ---------------------------------------------------------------- bad inputs, one test each
def _write_and_expect(store, table, error, match, version=None):
    staging = store.begin("g", version or info("v1"))
    with pytest.raises(error, match=match):
        staging.write_table(table, "part-7.parquet")


def test_width_mismatch_names_file(store):
    _write_and_expect(
        store,
        embedding_table([1, 2], unit_rows(2, 8)),
        SchemaError,
        r"part-7\.parquet.*'embedding'.*fixed_size_list<float32>\[4\]",
    )


def test_nan_vector_names_row(store):
    x = unit_rows(5)
    x[3, 1] = np.nan
    _write_and_expect(
        store,
        embedding_table(range(5), x),
        SchemaError,
        r"part-7\.parquet: 1 row\(s\) of embedding hold NaN/inf; first is row 3",
    )


def test_inf_side_info_names_row(store):
    side = unit_rows(3, 2)
    side[0, 0] = np.inf
    _write_and_expect(
        store,
        embedding_table(range(3), unit_rows(3), side),
        SchemaError,
        "side_info hold NaN/inf; first is row 0",
        version=info(side_info_width=2),
    )


def test_null_vector_names_row(store):
    emb = pa.array([[1.0, 0, 0, 0], None], pa.list_(pa.float32(), 4))
    _write_and_expect(
        store, pa.table({"id": [1, 2], "embedding": emb}), SchemaError, "row 1 has a null embedding"
    )


def test_unnormalised_row_of_normalised_version(store):
    x = unit_rows(4)
    x[2] *= 2
    _write_and_expect(
        store,
        embedding_table(range(4), x),
        SchemaError,
        r"not unit-norm; first is row 2 \(norm 2\)",
    )


def test_duplicate_ids_within_file_name_rows(store):
    _write_and_expect(
        store,
        embedding_table(["a", "b", "a"], unit_rows(3)),
        DuplicateIdError,
        r"duplicate id 'a' at .*part-7\.parquet row 0, .*part-7\.parquet row 2",
    )


def test_duplicate_ids_across_files_name_both_files(store):
    staging = store.begin("g", info())
    staging.write_table(embedding_table([1, 2, 3], unit_rows(3)), "part-0.parquet")
    staging.write_table(embedding_table([4, 2], unit_rows(2)), "part-1.parquet")
    with pytest.raises(
        DuplicateIdError, match=r"id 2 at .*part-0.parquet row 1, .*part-1.parquet row 1"
    ):
        staging.commit()
    assert store.versions("g") == []


@pytest.mark.parametrize("drop", ["id", "embedding"])
def test_missing_column(store, drop):
    table = embedding_table([1], unit_rows(1)).drop_columns([drop])
    _write_and_expect(
        store, table, SchemaError, rf"part-7.parquet: missing column\(s\) \['{drop}'\]"
    )


def test_wrong_id_type_and_side_info_declarations(store):
    table = embedding_table([1.5], unit_rows(1))
    _write_and_expect(store, table, SchemaError, "column 'id' has type double")
    table = embedding_table([1], unit_rows(1))
    _write_and_expect(
        store, table, SchemaError, "missing column 'side_info'", version=info(side_info_width=2)
    )
    table = embedding_table([1], unit_rows(1), unit_rows(1, 2))
    _write_and_expect(store, table, SchemaError, "declares no side info")


def test_metadata_of_another_model_is_refused(store):
    table = embedding_table([1], unit_rows(1), info=info("v9"))
    _write_and_expect(store, table, SchemaError, "raycompat.model_version='model-v9'")


def test_validate_table_with_width_only():
    validate_table(embedding_table(["x"], np.ones((1, 3))), 3, "mem")
    with pytest.raises(SchemaError, match=r"^mem: .*\[3\]"):
        validate_table(embedding_table(["x"], np.ones((1, 2))), 3, "mem")


def test_foreign_file_in_the_prefix_is_never_published(store):
    """The version is the writer's own list of parts: a file nobody recorded is not read."""
    staging = store.begin("g", info())
    staging.write_table(embedding_table([1], unit_rows(1)), "part-0.parquet")
    with open(f"{staging.path}/part-1.parquet", "wb") as handle:
        handle.write(b"PAR1 this is not parquet")
    published = staging.commit()
    assert [f.rsplit("/", 1)[1].split(".", 1)[1] for f in published.files] == ["part-0.parquet"]
    assert store.read("g", "v1").column("id").to_pylist() == [1]


def test_part_corrupted_after_writing_is_refused(store):
    staging = store.begin("g", info())
    path = staging.write_table(embedding_table([1, 2], unit_rows(2)), "part-0.parquet")
    size = os.path.getsize(path)
    with open(path, "wb") as handle:  # same size, not Parquet any more
        handle.write(b"PAR1" + b"x" * (size - 4))
    with pytest.raises(CorruptFileError, match=r"part-0\.parquet: not a readable Parquet file"):
        staging.commit()
    assert store.versions("g") == []


def test_bit_flip_in_published_file_is_caught_by_page_checksums(store):
    publish(store, "g", "v1", range(200), unit_rows(200))
    path = store.path("g", store.version("g", "v1").files[0])
    data = bytearray(open(path, "rb").read())
    data[len(data) // 3] ^= 0x10  # inside the embedding column's data page
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptFileError, match=r"part-00000\.parquet: corrupt data"):
        store.read("g", "v1")
    with pytest.raises(CorruptFileError, match=r"part-00000\.parquet"):
        list(store.iter_batches("g", "v1"))


def test_truncated_published_file(store):
    publish(store, "g", "v1", range(20), unit_rows(20))
    path = store.path("g", store.version("g", "v1").files[0])
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    with pytest.raises(
        ChangedFileError,
        match=rf"part-00000\.parquet: {size // 2} bytes, but the version record "
        rf"says {size}",
    ):
        store.read("g", "v1")
    record = store.path("g", "_versions", "v1.json")  # a record from before file_info existed
    raw = json.loads(open(record).read())
    raw.pop("file_info")
    open(record, "w").write(json.dumps(raw))
    with pytest.raises(CorruptFileError, match=r"part-00000\.parquet: not a readable Parquet"):
        store.read("g", "v1")


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "_versions", "a b", "x" * 129])
def test_unsafe_names_are_refused(store, name):
    with pytest.raises(UnsafePathError, match="not allowed"):
        store.begin(name, info())
    with pytest.raises(UnsafePathError, match="version name"):
        info(name)
    with pytest.raises(UnsafePathError, match="version name"):
        store.version("g", name)


def test_store_path_refuses_traversal(store):
    for parts in (("..", "x"), ("/etc",), ("a//b",), ("a", "./b")):
        with pytest.raises(UnsafePathError, match="store.path"):
            store.path(*parts)


@pytest.mark.parametrize(
    "bad",
    [
        "../../outside.parquet",
        "/etc/passwd",
        "s3://other/x.parquet",
        "_data/../../x.parquet",
        "a\\..\\b.parquet",
    ],
)
def test_record_paths_outside_gallery_are_refused(store, bad):
    publish(store, "g", "v1", [1], unit_rows(1))
    record = store.path("g", "_versions", "v1.json")
    raw = json.loads(open(record).read())
    raw["files"] = [bad]
    open(record, "w").write(json.dumps(raw))
    with pytest.raises(UnsafePathError, match=r"v1\.json: file path"):
        store.read("g", "v1")


def test_tampered_or_broken_records(store):
    publish(store, "g", "v1", [1, 2], unit_rows(2))
    record = store.path("g", "_versions", "v1.json")
    raw = json.loads(open(record).read())
    open(record, "w").write(json.dumps({**raw, "files": ["_data/v1/nope.parquet"]}))
    with pytest.raises(CorruptFileError, match=r"v1\.json: version record key 'file_info' does"):
        store.read("g", "v1")
    raw.pop("file_info")
    open(record, "w").write(json.dumps({**raw, "rows": 3}))
    with pytest.raises(ManifestError, match=r"v1\.json: record says 3 rows, its files hold 2"):
        store.read("g", "v1")
    open(record, "w").write(json.dumps({**raw, "files": ["_data/v1/nope.parquet"]}))
    with pytest.raises(ManifestError, match=r"nope\.parquet: part file does not exist"):
        store.read("g", "v1")
    open(record, "w").write(json.dumps({**raw, "version": "v2"}))
    with pytest.raises(ManifestError, match="record is for version 'v2'"):
        store.version("g", "v1")
    open(record, "w").write("{not json")
    with pytest.raises(CorruptFileError, match=r"v1\.json: version record is not valid JSON"):
        store.versions("g")
    with pytest.raises(ManifestError, match=r"no version 'v7'; it has \['v1'\]"):
        store.version("g", "v7")


def test_verification_of_rows_and_id_set(store):
    staging = store.begin("g", info())
    staging.write_table(embedding_table(["a", "b"], unit_rows(2)), "part-0.parquet")
    with pytest.raises(VerificationError, match="staged 2 rows, expected 3"):
        staging.commit(expected_rows=3)
    with pytest.raises(
        VerificationError, match=r"1 missing \(e.g. \['c'\]\), 1 unexpected \(e.g. \['b'\]\)"
    ):
        staging.commit(expected_ids=pa.array(["a", "c"]))
    with pytest.raises(VerificationError, match="cannot be compared"):
        staging.commit(expected_ids=pa.array([[1.0]]))
    assert staging.commit(expected_ids=["b", "a"]).rows == 2


def test_bad_part_names_empty_staging_and_storage_options(store, tmp_path):
    staging = store.begin("g", info())
    with pytest.raises(StoreError, match="must end with '.parquet'"):
        staging.write_table(embedding_table([1], unit_rows(1)), "part-0.csv")
    with pytest.raises(StoreError, match="no part files"):
        staging.commit()
    with pytest.raises(StoreError, match="not used for local root"):
        GalleryStore(str(tmp_path), {"anon": True})
    with pytest.raises(UnknownNameError, match="valid names: file, s3"):
        GalleryStore("gs://bucket/x")
    with pytest.raises(SchemaError, match=r"no column\(s\) \['nope'\]"):
        publish(store, "g", "v1", [1], unit_rows(1))
        store.read("g", "v1", columns=["id", "nope"])


# ------------------------------------------------------- atomic publish under injected failure
def test_failed_publish_leaves_manifest_unchanged_and_can_resume_or_abort(store):
    publish(store, "g", "v1", ["a", "b"], unit_rows(2))
    before = store.versions("g")
    ids, x = [f"r{i}" for i in range(8)], unit_rows(8, seed=3)

    def job(staging, parts, fail_after=None):
        for part in parts:
            if part == fail_after:
                raise RuntimeError("worker killed")
            rows = slice(2 * part, 2 * part + 2)
            staging.write_table(embedding_table(ids[rows], x[rows]), f"part-{part}.parquet")
        return staging.commit(expected_rows=8, expected_ids=ids)

    first = store.begin("g", info("v2"), "nightly")
    with pytest.raises(RuntimeError, match="worker killed"):
        job(first, range(4), fail_after=2)
    first.release()  # what a failing job does; a killed job's lease times out instead
    assert store.versions("g") == before and store.latest("g").version == "v1"
    assert store.read("g", "v1").num_rows == 2
    with pytest.raises(ManifestError, match="no version 'v2'"):
        store.read("g", "v2")

    rerun = store.begin("g", info("v2"), "nightly")  # the same prefix: two parts are there
    assert len(rerun.files()) == 2
    with pytest.raises(VerificationError, match="staged 4 rows, expected 8"):
        rerun.commit(expected_rows=8)
    assert job(rerun, [2, 3]).rows == 8
    assert store.read("g", "v2").column("id").to_pylist() == ids
    with pytest.raises(StoreError, match="is published; not deleting"):
        rerun.abort()
    with pytest.raises(PublishConflictError, match=r"v2\.json already exists"):
        rerun.write_table(embedding_table(["late"], unit_rows(1)), "part-0.parquet")
    assert store.read("g", "v2").column("id").to_pylist() == ids

    other = store.begin("g", info("v3"), "crashed")
    written = other.write_table(embedding_table(["z"], unit_rows(1)), "part-0.parquet")
    other.abort()  # its own part goes; the lease stays, marked aborted, for gc
    assert other.files() == [] and not os.path.exists(written)
    assert os.listdir(os.path.join(other.path, "_parts")) == []


def test_release_after_abort_is_quiet_and_recreates_nothing(store, caplog):
    """A failing pipeline releases its staging area in its cleanup, after a quality gate may
    have aborted it: abort released the lease already, so there is nothing to release and
    nothing to warn about (it used to log "lease not released: its file changed hands")."""
    staging = store.begin("g", info("v2"), "gated")
    written = staging.write_table(embedding_table(["a"], unit_rows(1)), "part-0.parquet")
    staging.abort()
    lease = sorted(os.listdir(os.path.join(staging.path, "_lease")))
    staging.release()
    assert not os.path.exists(written)
    assert sorted(os.listdir(os.path.join(staging.path, "_lease"))) == lease
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text


def test_crash_inside_a_part_write_leaves_no_file(store, monkeypatch):
    import raycompat.store.read.parquet as parquet_module

    def half_write(table, where, **kw):
        where.write(b"PAR1 half a file")
        raise OSError("disk full")

    staging = store.begin("g", info())
    monkeypatch.setattr(parquet_module.pq, "write_table", half_write)
    with pytest.raises(OSError, match="disk full"):
        staging.write_table(embedding_table([1], unit_rows(1)), "part-0.parquet")
    assert staging.files() == [] and os.listdir(f"{staging.path}/_tmp") == []


# --------------------------------------------------------------------- concurrent publishers
def test_racing_publishers_exactly_one_wins(store):
    for round_ in range(4):
        version, barrier, results = f"v{round_}", threading.Barrier(3), {}

        def publisher(name, seed, version=version, barrier=barrier, results=results):
            staging = store.begin("g", info(version), name)
            staging.write_table(embedding_table([name], unit_rows(1, seed=seed)), "p.parquet")
            barrier.wait()
            try:
                results[name] = (staging, staging.commit())
            except PublishConflictError as error:
                results[name] = (staging, error)

        threads = [threading.Thread(target=publisher, args=(f"w{i}", i)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, (_, r) in results.items() if isinstance(r, VersionInfo)]
        assert len(winners) == 1 and len(results) == 3, results
        for name, (staging, outcome) in results.items():
            if name not in winners:
                assert re.search("already exists|by another writer first", str(outcome))
                staging.abort()
        assert store.read("g", version).column("id").to_pylist() == winners
    assert [v.version for v in store.versions("g")] == ["v0", "v1", "v2", "v3"]


_RACER = """
import os, sys, time
import numpy as np
from raycompat.store import GalleryStore, PublishConflictError, VersionInfo, embedding_table
root, name, go = sys.argv[1:4]
staging = GalleryStore(root).begin("g", VersionInfo("v1", "m", 2, False, "v1 = f(m)"), name)
staging.write_table(embedding_table([name], np.ones((1, 2))), "p.parquet")
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
try:
    staging.commit()
    print("won", flush=True)
except PublishConflictError as error:
    print("lost", error, flush=True)
"""


def test_racing_publisher_processes_exactly_one_wins(store, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, store.root, f"p{i}", str(go)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(3)
    ]
    assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 3
    go.touch()
    outcomes = [p.communicate(timeout=60)[0].split()[0] for p in procs]
    assert sorted(outcomes) == ["lost", "lost", "won"]
    winner = f"p{outcomes.index('won')}"
    assert store.read("g", "v1").column("id").to_pylist() == [winner]


def test_conflict_detected_by_the_atomic_create_itself(store):
    first, second = (store.begin("g", info(), n) for n in ("a", "b"))
    for staging, name in ((first, "a"), (second, "b")):
        staging.write_table(embedding_table([name], unit_rows(1)), "p.parquet")
    first.commit()
    second._published = lambda: False  # as if it checked just before the winner's record landed
    with pytest.raises(PublishConflictError, match="published by another writer first"):
        second.commit()
    second.abort()  # the loser cleans its own prefix; the winner's files stay
    assert store.read("g", "v1").column("id").to_pylist() == ["a"]
    with pytest.raises(PublishConflictError, match="already has version 'v1'"):
        store.begin("g", info())


# ---------------------------------------------------------------------------- faiss index


def test_flat_index_matches_brute_force(store, one_faiss_thread):
    x, queries = unit_rows(300, 8), unit_rows(7, 8, seed=5)
    ids = [f"img{i}" for i in range(300)]
    publish(store, "g", "v1", ids, x)
    with pytest.raises(ManifestError, match="no index for g/v1"):
        load_version_index(store, "g", "v1")
    build_version_index(store, "g", "v1", batch_size=64, use_gpu=False)
    loaded = load_version_index(store, "g", "v1", use_gpu=False)
    assert loaded.index.kind == "flat" and loaded.index.distance.name == "cosine"
    scores, found = loaded.search(queries, 5)
    ref = queries @ x.T
    top = np.argsort(-ref, axis=1)[:, :5]
    assert found.tolist() == [[ids[j] for j in row] for row in top]
    np.testing.assert_allclose(scores, np.take_along_axis(ref, top, 1), rtol=1e-5, atol=1e-6)


def test_ivfpq_index_builds_and_rebuild_replaces(store, one_faiss_thread):
    x = unit_rows(2000, 8)
    publish(store, "g", "v1", np.arange(2000) * 7, x, normalized=False)
    first = build_version_index(  # kind="auto" above flat_max_rows is sharded_ivf
        store,
        "g",
        "v1",
        kind="ivfpq",
        flat_max_rows=1000,
        nlist=8,
        m=4,
        nbits=4,
        train_size=500,
        batch_size=300,
        use_gpu=False,
    )
    loaded = load_version_index(store, "g", "v1", use_gpu=False)
    assert loaded.index.kind == "ivfpq" and loaded.index.distance.name == "l2"
    assert loaded.index.ntotal == 2000
    loaded.index.set_nprobe(8)
    _, found = loaded.search(x[:50], 10)
    assert np.mean(found[:, 0] == np.arange(50) * 7) > 0.8  # PQ-compressed self-match
    with pytest.raises(UnknownNameError, match="valid names: flat, ivfpq"):
        build_version_index(store, "g", "v1", kind="hnsw")
    second = build_version_index(store, "g", "v1", kind="flat", use_gpu=False)
    assert second != first
    _, found = load_version_index(store, "g", "v1", use_gpu=False).search(x[:5], 1)
    assert found[:, 0].tolist() == [0, 7, 14, 21, 28]


def test_a_part_is_fsynced_before_its_record_is_written_and_after_its_rename(tmp_path, monkeypatch):
    """A crash after the version's (fsynced) record is linked must not find a part whose bytes
    were still in the page cache: the data is fsynced before the part record that vouches for
    it, and the folder after the rename."""
    import os

    from raycompat.store import embedding_table

    store = GalleryStore(str(tmp_path / "s"))
    staging = store.begin("g", VersionInfo("v1", "m", 4, False, "v1 = extract(m)"))
    events = []
    real_fsync, real_create = os.fsync, staging._backend.create_exclusive

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def create(path, data):
        events.append(("record", path))
        return real_create(path, data)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(staging._backend, "create_exclusive", create)
    staging.write_table(embedding_table(np.arange(3), np.ones((3, 4), np.float32)), "p.parquet")
    kinds = [(kind, os.path.basename(path)) for kind, path in events]
    records = [i for i, (kind, name) in enumerate(kinds) if kind == "record"]
    record = next(i for i in records if "p.parquet" in kinds[i][1])
    data = [i for i, (kind, name) in enumerate(kinds) if kind == "fsync" and ".parquet" in name]
    assert data and data[0] < record  # the data file, before its record
    folder = str(tmp_path / "s" / "g")
    assert any(
        kind == "fsync" and path.startswith(folder) and not path.endswith(".parquet")
        for kind, path in events[record:]
    )  # the folder, after the rename
