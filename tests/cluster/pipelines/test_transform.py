"""The transform's actor body in process: zero-copy input tensors, the per-chunk CPU it reports
to the driver (``runner.ChunkWorker``), and its read-ahead output bit-identical to the plain
loop, in process and through ``transform_version`` with a pool sized from local Ray."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from raycompat.cluster.pipelines import (
    RunOptions,
    apply_transformation,
    transform_version,
)
from raycompat.cluster.pipelines.inputs import plan_version_chunks
from raycompat.cluster.pipelines.runner import chunk_worker_kwargs
from raycompat.cluster.pipelines.transform import TransformChunks, _rows
from raycompat.store import GalleryStore, VersionInfo, embedding_schema, embedding_table
from raycompat.store.commit.part_record import IdFingerprint, PartRecord, part_of_file
from raycompat.store.read.vectors import vectors
from raycompat.transformations import (
    FCTTransformation,
    load_transformation,
    save_transformation,
    side_info_transformation,
)

D = 8


def _source(tmp_path) -> GalleryStore:
    store = GalleryStore(str(tmp_path / "store"))
    staging = store.begin("g", VersionInfo("v1", "m1", D, False, "v1"), "init")
    x = np.random.default_rng(0).standard_normal((300, D), dtype=np.float32)
    staging.write_table(embedding_table(np.arange(300), x), "in.parquet")
    staging.commit(expected_rows=300)
    return store


def test_input_rows_are_a_view_of_arrows_buffer(tmp_path):
    store = _source(tmp_path)
    path = store.path("g", store.version("g", "v1").files[0])
    batch = next(pq.ParquetFile(path).iter_batches(batch_size=100))
    values = batch.column("embedding").values
    rows = _rows(batch.slice(10), "embedding")
    assert rows.data_ptr() == values.buffers()[1].address + (values.offset + 10 * D) * 4
    assert torch.equal(rows, torch.from_numpy(values.to_numpy().reshape(-1, D)[10:].copy()))


def test_worker_writes_h_of_its_chunk_and_reports_its_cpu(tmp_path):
    store, threads = _source(tmp_path), torch.get_num_threads()
    torch.manual_seed(0)
    save_transformation(tmp_path / "fct", FCTTransformation(D, 0, D, width=16), "h")
    source, target = store.version("g", "v1"), VersionInfo("v2", "m2", D, False, "v2 = h(v1)")
    chunks, _, _ = plan_version_chunks(store, "g", source, 1000)
    staging = store.begin("g", target, "t")
    try:
        kwargs = chunk_worker_kwargs(store, "g", staging, embedding_schema(D, "int64"))
        worker = TransformChunks(
            transformation=str(tmp_path / "fct"),
            side_info_transformation=None,
            source=source,
            run=RunOptions(batch_size=64),
            **kwargs,
        )
        out = worker({"chunk": [json.dumps(asdict(chunks[0]))]})
    finally:
        staging.release()
        torch.set_num_threads(threads)
    assert out["rows"] == [300] and out["cpu_s"][0] > 0
    record = PartRecord.from_json(out["record"][0].encode(), "t")
    written = pq.read_table(f"{staging.path}/{record.file}")
    expected = apply_transformation(pq.read_table(store.path("g", source.files[0])), worker.h)
    got, want = (np.stack(t.column("embedding").to_pylist()) for t in (written, expected))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert record.ids == record.input_ids == IdFingerprint.of(written.column("id"))


def _source_with_side_info(root, files: int, rows: int, group_rows: int) -> GalleryStore:
    """``g/v1``: ``files`` files of ``rows`` rows (``group_rows``-row groups), D-d embedding and
    side info, int ids and a carried ``label`` column."""
    store = GalleryStore(str(root))
    info = VersionInfo("v1", "m1", D, False, "v1", side_info_width=D)
    staging = store.begin("g", info, "init")
    rng = np.random.default_rng(1)
    for k in range(files):
        ids = np.arange(k * rows, (k + 1) * rows) * 7 + 3
        x, side = (rng.standard_normal((rows, D), dtype=np.float32) for _ in range(2))
        table = embedding_table(ids, x, side, labels=ids % 3)
        staging.write_table(table, f"in-{k}.parquet", row_group_size=group_rows)
    staging.commit(expected_rows=files * rows)
    return store


def _random_h_and_g(directory) -> str:
    torch.manual_seed(0)
    h = FCTTransformation(D, D, D, width=16)
    g = side_info_transformation(D, D, D, width=16)
    for module in (h, g):  # eval-mode BN that is not the identity
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
    save_transformation(directory, h, "h")
    save_transformation(directory, g, "g")
    return str(directory)


def _plain_loop(path: str, fct: str, batch_size: int) -> pa.Table:
    """The naive reference: each batch of the file through h and g, one at a time, 1 thread."""
    h, g = load_transformation(fct, "h"), load_transformation(fct, "g")
    threads, tables = torch.get_num_threads(), []
    torch.set_num_threads(1)  # as the actors (threads_per_actor=1)
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            old, side = (vectors(batch, c) for c in ("embedding", "side_info"))
            with torch.no_grad():
                new = h(torch.from_numpy(old), torch.from_numpy(side)).numpy()
                new_side = g(torch.from_numpy(old), torch.from_numpy(side)).numpy()
            ids, labels = (batch[c].to_numpy() for c in ("id", "label"))
            tables.append(embedding_table(ids, new, new_side, labels))
    finally:
        torch.set_num_threads(threads)
    return pa.concat_tables(tables)


def _assert_identical(written: pa.Table, expected: pa.Table) -> None:
    """Same ids in the same order, bit-identical vectors, same carried column."""
    assert written["id"].to_pylist() == expected["id"].to_pylist()
    for column in ("embedding", "side_info"):
        np.testing.assert_array_equal(vectors(written, column), vectors(expected, column))
    assert written["label"].to_pylist() == expected["label"].to_pylist()


def test_read_ahead_writes_each_batch_once_in_order_bit_identical_to_the_plain_loop(tmp_path):
    store = _source_with_side_info(tmp_path / "store", files=1, rows=1000, group_rows=300)
    fct = _random_h_and_g(tmp_path / "fct")
    source, threads = store.version("g", "v1"), torch.get_num_threads()
    target = VersionInfo("v2", "m2", D, False, "v2 = h(v1)", side_info_width=D)
    chunks, _, carried = plan_version_chunks(store, "g", source, 10_000)
    schema = pa.schema(list(embedding_schema(D, "int64", D)) + carried)
    staging = store.begin("g", target, "t")
    try:
        worker = TransformChunks(
            transformation=fct,
            side_info_transformation=fct,
            source=source,
            run=RunOptions(batch_size=64),  # 16 batches: read ahead, in flight, written
            **chunk_worker_kwargs(store, "g", staging, schema),
        )
        out = worker({"chunk": [json.dumps(asdict(chunks[0]))]})
    finally:
        staging.release()
        torch.set_num_threads(threads)
    record = PartRecord.from_json(out["record"][0].encode(), "t")
    written = pq.read_table(f"{staging.path}/{record.file}")
    _assert_identical(written, _plain_loop(store.path("g", source.files[0]), fct, 64))


@pytest.mark.ray
def test_transform_with_an_auto_pool_equals_the_plain_loop(tmp_path, ray_local, caplog):
    store = _source_with_side_info(tmp_path / "store", files=6, rows=300, group_rows=100)
    fct = _random_h_and_g(tmp_path / "fct")
    target = VersionInfo("v2", "m2", D, False, "v2 = h(v1)", side_info_width=D)
    run = RunOptions(rows_per_file=300, batch_size=64, pool="auto")  # one chunk per file
    with caplog.at_level(logging.INFO, logger="raycompat.cluster.pipelines.transform"):
        info = transform_version(store, "g", "v1", target, fct, fct, run)["version"]
    recorded = store.version("g", "v2")  # history's operation and parameters (issue 40)
    assert (recorded.operation, recorded.parameters["rows_per_file"]) == ("transform", 300)
    # ray_local has 4 CPUs: 4 actors x 1 CPU for the 6 chunks
    assert "6 chunk(s): 4 actor(s) x 1 CPU x 0.0 GPU" in caplog.text
    source = store.version("g", "v1")
    for k, rel in enumerate(source.files):
        part = next(f for f in info.files if part_of_file(f) == f"part-{k:05d}-0000.parquet")
        written = pq.read_table(store.path("g", part))
        _assert_identical(written, _plain_loop(store.path("g", rel), fct, 64))


@pytest.mark.ray
def test_a_procrustes_map_transforms_a_gallery_as_h_does(tmp_path, ray_local):
    """A training-free kind goes through the same pipeline as FCT's h (issue 41, item 2's
    gallery side): the kind is read from h.json, no side-information, each row is x W."""
    from raycompat.transformations import PairStatistics, fit_procrustes

    store = _source(tmp_path)
    rng = np.random.default_rng(1)
    rotation, _ = np.linalg.qr(rng.standard_normal((D, D)))
    x = rng.standard_normal((200, D)).astype(np.float32)
    fit = fit_procrustes(PairStatistics.of(x, (x @ rotation).astype(np.float32)))
    save_transformation(tmp_path / "map", fit.transformation, "h", **fit.info())
    target = VersionInfo("v2", "m2", D, False, "v2 = procrustes(v1)")
    run = RunOptions(rows_per_file=300, batch_size=64)
    info = transform_version(store, "g", "v1", target, str(tmp_path / "map"), None, run)
    assert info["version"].rows == 300

    def rows(version: str) -> tuple[np.ndarray, np.ndarray]:
        parts = [pq.read_table(store.path("g", f)) for f in store.version("g", version).files]
        table = pa.concat_tables(parts).sort_by("id")
        return table.column("id").to_numpy(), vectors(table, "embedding")

    (old_ids, old), (new_ids, new) = rows("v1"), rows("v2")
    assert np.array_equal(old_ids, new_ids)
    np.testing.assert_allclose(new, old @ rotation, atol=1e-4)
