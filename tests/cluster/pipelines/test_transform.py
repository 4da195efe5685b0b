"""The transform's actor body in process (no Ray runtime): zero-copy input tensors, and the
per-chunk CPU it reports to the driver (``runner.ChunkWorker``)."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pyarrow.parquet as pq
import torch

from raycompat.cluster.pipelines import RunOptions, apply_transformation
from raycompat.cluster.pipelines.inputs import plan_version_chunks
from raycompat.cluster.pipelines.runner import chunk_worker_kwargs
from raycompat.cluster.pipelines.transform import TransformChunks, _rows
from raycompat.fct.models import save_transformation
from raycompat.fct.transformation import fct_transformation
from raycompat.store import GalleryStore, VersionInfo, embedding_schema, embedding_table
from raycompat.store.part_record import IdFingerprint, PartRecord

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
    rows = _rows(batch.slice(10), "embedding", torch.device("cpu"))
    assert rows.data_ptr() == values.buffers()[1].address + (values.offset + 10 * D) * 4
    assert torch.equal(rows, torch.from_numpy(values.to_numpy().reshape(-1, D)[10:].copy()))


def test_worker_writes_h_of_its_chunk_and_reports_its_cpu(tmp_path):
    store, threads = _source(tmp_path), torch.get_num_threads()
    torch.manual_seed(0)
    save_transformation(tmp_path / "fct", fct_transformation(D, 0, D, width=16), "h")
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
