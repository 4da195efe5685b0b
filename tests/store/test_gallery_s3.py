"""raycompat.store on S3 (moto server via the ``s3_bucket`` fixture): round trips through both
bulk-I/O clients, the conditional-put primitive, atomic and concurrent publish, errors naming
``s3://`` files, credentials reaching the native client, and the per-version index."""

from __future__ import annotations

import threading
import time

import faiss
import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from raycompat.index.version_index import (
    build_version_index,
    load_version_index,
    open_version_index,
)
from raycompat.io.uri import native_s3_options
from raycompat.store import (
    CorruptFileError,
    CorruptIndexError,
    GalleryStore,
    PublishConflictError,
    StoreError,
    VersionInfo,
    embedding_table,
)
from raycompat.store.commit.lease import LeaseHeldError
from raycompat.store.commit.part_record import part_of_file


def unit_rows(n: int, width: int = 4, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, width)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def info(version: str = "v1", width: int = 4) -> VersionInfo:
    return VersionInfo(version, f"model-{version}", width, True, f"{version} = extract(m)")


@pytest.fixture(params=["native", "fsspec"])
def store(request, s3_bucket) -> GalleryStore:
    bucket, options = s3_bucket
    return GalleryStore(f"s3://{bucket}/stores/main", options, bulk_io=request.param)


def test_bulk_filesystem_follows_bulk_io(store):
    expected = pafs.S3FileSystem if store.bulk_io == "native" else pafs.PyFileSystem
    assert isinstance(store.filesystem, expected)


def test_round_trip_refusing_a_foreign_part(store):
    x = unit_rows(12)
    staging = store.begin("faces", info(), "job-1")
    assert staging.uri.startswith("s3://") and staging.uri.endswith("/faces/_data/v1/job-1")
    staging.write_table(embedding_table([f"a{i}" for i in range(6)], x[:6]), "part-1.parquet")
    # a file put there by a writer without the lease (e.g. Ray Data's write_parquet): no record
    foreign = f"{staging.path}/0_000001_000000.parquet"
    pq.write_table(embedding_table(["z"], x[:1]), foreign, filesystem=staging.filesystem)
    staging.write_table(embedding_table([f"a{i}" for i in range(6, 12)], x[6:]), "part-0.parquet")
    published = staging.commit(expected_rows=12, expected_ids=[f"a{i}" for i in range(12)])
    assert published.rows == 12 and len(published.files) == 2  # the foreign file is not read
    assert not any("0_000001_000000" in f for f in published.files)

    reader = GalleryStore(store.root, store.storage_options, bulk_io=store.bulk_io)
    table = reader.read("faces", "v1")
    got = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(12, 4)
    np.testing.assert_array_equal(got, np.concatenate([x[6:], x[:6]]))  # files in name order
    assert sum(b.num_rows for b in reader.iter_batches("faces", "v1", batch_size=5)) == 12
    assert reader.galleries() == ["faces"] and reader.latest("faces") == published


def test_conditional_put_is_supported_end_to_end(store):
    path = store.path("probe.json")
    store.backend.create_exclusive(path, b"first")
    with pytest.raises(FileExistsError):
        store.backend.create_exclusive(path, b"second")
    with store.filesystem.open_input_stream(path) as handle:
        assert handle.read() == b"first"


def test_failed_publish_is_invisible_and_resumable(store):
    x = unit_rows(6)
    staging = store.begin("g", info(), "nightly", lease_timeout_s=2.0)  # slack for a busy CI
    staging.write_table(embedding_table([0, 1, 2], x[:3]), "part-0.parquet")
    staging.lease.stop()  # the job dies here (no more heartbeats); a reader sees nothing
    assert store.versions("g") == [] and store.galleries() == []
    with pytest.raises(LeaseHeldError, match=r"nightly/_lease: .* last heartbeat"):
        store.begin("g", info(), "nightly")  # not yet stale
    time.sleep(2.2)
    rerun = store.begin("g", info(), "nightly")  # the lease timed out: taken over
    assert [part_of_file(p) for p in rerun.files()] == ["part-0.parquet"]
    rerun.write_table(embedding_table([3, 4, 5], x[3:]), "part-1.parquet")
    assert rerun.commit(expected_rows=6).rows == 6
    assert store.read("g", "v1").column("id").to_pylist() == list(range(6))


def test_racing_publishers_exactly_one_wins(store):
    barrier, results = threading.Barrier(2), {}

    def publisher(name):
        staging = store.begin("g", info(), name)
        staging.write_table(embedding_table([name], unit_rows(1)), "p.parquet")
        barrier.wait()
        try:
            results[name] = (staging, staging.commit())
        except PublishConflictError as error:
            results[name] = (staging, error)

    threads = [threading.Thread(target=publisher, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, (_, r) in results.items() if isinstance(r, VersionInfo)]
    assert len(winners) == 1, results
    loser = ({"a", "b"} - set(winners)).pop()
    results[loser][0].abort()
    assert results[loser][0].files() == []
    assert store.read("g", "v1").column("id").to_pylist() == winners


def test_conflict_detected_by_conditional_put(store):
    first, second = (store.begin("g", info(), n) for n in ("a", "b"))
    for staging, name in ((first, "a"), (second, "b")):
        staging.write_table(embedding_table([name], unit_rows(1)), "p.parquet")
    first.commit()
    second._published = lambda: False  # checked just before the winner's record landed
    with pytest.raises(PublishConflictError, match=r"s3://.*v1\.json was published by another"):
        second.commit()


def test_corrupt_file_is_named_by_uri(store):
    staging = store.begin("g", info())
    path = staging.write_table(embedding_table(["a"], unit_rows(1)), "bad.parquet")
    size = store.filesystem.get_file_info(path).size
    with store.filesystem.open_output_stream(path) as handle:  # same size, not Parquet
        handle.write(b"x" * size)
    with pytest.raises(CorruptFileError, match=r"s3://.*/_data/v1/.*bad\.parquet: not a readable"):
        staging.commit()


def test_native_options_translation():
    assert native_s3_options(
        {
            "key": "k",
            "secret": "s",
            "token": "t",
            "client_kwargs": {"endpoint_url": "http://h:9000/", "region_name": "eu-west-1"},
        }
    ) == {
        "access_key": "k",
        "secret_key": "s",
        "session_token": "t",
        "endpoint_override": "h:9000",
        "scheme": "http",
        "region": "eu-west-1",
    }
    with pytest.raises(StoreError, match=r"\['config_kwargs', 'client_kwargs.verify'\]"):
        native_s3_options({"config_kwargs": {}, "client_kwargs": {"verify": False}})


def test_untranslatable_options_fall_back_to_s3fs(s3_bucket):
    bucket, options = s3_bucket
    options = {**options, "config_kwargs": {"max_pool_connections": 4}}
    assert isinstance(GalleryStore(f"s3://{bucket}/x", options).filesystem, pafs.PyFileSystem)
    with pytest.raises(StoreError, match="config_kwargs"):
        GalleryStore(f"s3://{bucket}/x", options, bulk_io="native")
    with pytest.raises(StoreError, match="bulk_io must be"):
        GalleryStore(f"s3://{bucket}/x", options, bulk_io="fast")


def test_explicit_credentials_reach_the_native_client(s3_bucket, s3_strict_auth):
    bucket, options = s3_bucket
    creds = {**options, **s3_strict_auth}
    store = GalleryStore(f"s3://{bucket}/auth", creds, bulk_io="native")
    staging = store.begin("g", info())
    staging.write_table(embedding_table([1, 2], unit_rows(2)), "p.parquet")
    staging.commit()
    assert store.read("g", "v1").num_rows == 2
    anonymous_env = GalleryStore(f"s3://{bucket}/auth", options, bulk_io="native")
    with pytest.raises(OSError, match="ACCESS_DENIED|Forbidden|403"):
        anonymous_env.read("g", "v1")


def publish_indexable(store: GalleryStore):
    """Publish ``g/v1``: 50 unit rows of width 8 with ids ``i0..i49``; returns the rows."""
    x = unit_rows(50, 8)
    staging = store.begin("g", info(width=8))
    staging.write_table(embedding_table([f"i{k}" for k in range(50)], x), "p.parquet")
    staging.commit()
    return x


def test_index_round_trip_on_s3(store):
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        x = publish_indexable(store)
        assert build_version_index(store, "g", "v1", use_gpu=False).startswith("s3://")
        scores, ids = load_version_index(store, "g", "v1", use_gpu=False).search(x[[3, 9]], 2)
        assert ids[:, 0].tolist() == ["i3", "i9"]
        np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    finally:
        faiss.omp_set_num_threads(before)


def test_corrupt_index_on_s3_is_detected_and_rebuilt(store):
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        x = publish_indexable(store)
        uri = build_version_index(store, "g", "v1", use_gpu=False)
        path = f"{uri.removeprefix('s3://')}/index.faiss"
        with store.filesystem.open_input_stream(path) as handle:
            data = handle.read()
        with store.filesystem.open_output_stream(path) as handle:
            handle.write(data[:-16])  # a truncated upload
        with pytest.raises(CorruptIndexError, match=f"s3://{path}: expected {len(data)} bytes"):
            open_version_index(store, "g", "v1", rebuild=False, use_gpu=False)
        index = open_version_index(store, "g", "v1", rebuild=True, use_gpu=False)
        assert index.search(x[[3]], 1)[1].tolist() == [["i3"]]
    finally:
        faiss.omp_set_num_threads(before)
