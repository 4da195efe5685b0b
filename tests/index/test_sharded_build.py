"""The sharded IVF index of large versions: nlist rule, Ray-built shards merged on disk and
searched memory-mapped, exact at full probe, resumable, verified, ids mapped back lazily."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pytest

from raycompat.cli.app import main as cli
from raycompat.index.ivf import SHARDED_IVF, ivf_nlist, ivf_nprobe
from raycompat.index.mapped_ids import MappedIds
from raycompat.index.version_index import (
    build_version_index,
    load_version_index,
    open_version_index,
)
from raycompat.store import CorruptIndexError, GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

ROWS, WIDTH, PARTS, ROWS_PER_SHARD = 4000, 16, 8, 1000  # 4 shards of 2 parts each
OPTIONS = dict(flat_max_rows=1000, rows_per_shard=ROWS_PER_SHARD, use_gpu=False)


pytestmark = pytest.mark.usefixtures("one_faiss_thread")


def clustered(n: int, seed: int) -> np.ndarray:
    """Unit rows around 40 fixed centres (so a few lists hold a query's neighbours)."""
    centres = np.random.default_rng(99).normal(size=(40, WIDTH))
    rng = np.random.default_rng(seed)
    x = centres[rng.integers(0, 40, n)] + 0.3 * rng.normal(size=(n, WIDTH))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def gallery_ids(kind: str) -> list:
    return [f"img-{k}" for k in range(ROWS)] if kind == "str" else list(np.arange(ROWS) * 7 + 3)


def publish(store: GalleryStore, ids: list, x: np.ndarray) -> None:
    staging = store.begin("g", VersionInfo("v1", "m1", WIDTH, True, "v1 = extract(m1)"))
    step = ROWS // PARTS
    for p in range(PARTS):
        rows = slice(p * step, (p + 1) * step)
        staging.write_table(embedding_table(ids[rows], x[rows]), f"part-{p:05d}.parquet")
    staging.commit(expected_rows=ROWS)


def ray_tasks():
    from raycompat.cluster.pipelines.index import RayTasks

    return RayTasks(workers=2, cpus_per_task=1)


@pytest.fixture
def gallery(tmp_path):
    """``(store, ids, x)``: a published 4000 x 16 cosine version in 8 parts, string ids."""
    store, ids, x = GalleryStore(str(tmp_path / "store")), gallery_ids("str"), clustered(ROWS, 0)
    publish(store, ids, x)
    return store, ids, x


def build_folder(store: GalleryStore) -> Path:
    pointer = json.loads(Path(store.path("g", "_index", "v1.json")).read_text())
    return Path(store.path("g", "_index", "v1", pointer["build"]))


def shard_files(store: GalleryStore) -> dict[str, os.stat_result]:
    return {p.name: p.stat() for p in sorted((build_folder(store) / "_shards").glob("*.faiss"))}


def exact_top(queries: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    scores = queries.astype(np.float64) @ x.astype(np.float64).T
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("id_kind", ["int", "str"])
def test_ray_build_is_exact_at_full_probe_and_answers_gallery_ids(tmp_path, ray_local, id_kind):
    store, ids, x = GalleryStore(str(tmp_path / "store")), gallery_ids(id_kind), clustered(ROWS, 0)
    publish(store, ids, x)
    build_version_index(store, "g", "v1", runner=ray_tasks(), **OPTIONS)  # kind="auto"
    pointer = json.loads(Path(store.path("g", "_index", "v1.json")).read_text())
    assert pointer["kind"] == SHARDED_IVF and pointer["shards"] == 4
    assert pointer["nlist"] == ivf_nlist(ROWS) == 64 and pointer["nprobe"] == ivf_nprobe(64)
    index = load_version_index(store, "g", "v1", use_gpu=False)
    assert index.index.kind == SHARDED_IVF and index.index.ntotal == ROWS
    queries = clustered(50, seed=1)
    truth = np.asarray(ids, dtype=object)[exact_top(queries, x, 10)]
    scores, found = index.search(queries, 10, nprobe=64)  # every list: exhaustive
    assert found.tolist() == truth.tolist()  # recall@10 = 1, in the exact order
    np.testing.assert_allclose(scores[:, 0], np.max(queries @ x.T, axis=1), atol=1e-5)
    _, default = index.search(queries, 10)  # nprobe 16 of 64 lists
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(default, truth, strict=True)])
    assert recall >= 0.9
    assert found.dtype == (np.int64 if id_kind == "int" else object)


def test_rerun_redoes_only_a_deleted_shard_with_an_identical_result(gallery, ray_local):
    store, ids, x = gallery
    build_version_index(store, "g", "v1", runner=ray_tasks(), **OPTIONS)
    pointer = Path(store.path("g", "_index", "v1.json")).read_text()
    queries = clustered(30, seed=2)
    before = load_version_index(store, "g", "v1", use_gpu=False).search(queries, 10)
    first = shard_files(store)
    (build_folder(store) / "_shards" / "shard-00002.faiss").unlink()
    build_version_index(store, "g", "v1", runner=ray_tasks(), **OPTIONS)
    again = shard_files(store)
    assert sorted(again) == sorted(first)
    rebuilt = [n for n in first if again[n].st_ino != first[n].st_ino]
    assert rebuilt == ["shard-00002.faiss"]
    assert Path(store.path("g", "_index", "v1.json")).read_text() == pointer  # same sha256s
    after = load_version_index(store, "g", "v1", use_gpu=False).search(queries, 10)
    assert after[1].tolist() == before[1].tolist()
    np.testing.assert_array_equal(after[0], before[0])


def test_corrupt_shard_is_detected_and_redone(gallery, caplog):
    store, _, _ = gallery
    with caplog.at_level(logging.INFO, logger="raycompat.index.sharded"):
        build_version_index(store, "g", "v1", **OPTIONS)  # in-process tasks: the core alone
    shards = (build_folder(store) / "_shards").glob("*.json")
    records = [json.loads(p.read_text()) for p in shards]
    assert len(records) == 4
    assert all(r["seconds"].keys() == {"read", "add", "write"} for r in records)
    assert all(v >= 0 for r in records for v in r["seconds"].values())
    spent = {p: sum(r["seconds"][p] for r in records) for p in ("read", "add", "write")}
    assert spent["add"] > 0
    [logged] = [r.getMessage() for r in caplog.records if "spent read" in r.getMessage()]
    assert logged.startswith("g/v1: the add tasks (4 shards) spent read ")
    assert f"add {spent['add']:.1f} s ({1e6 * spent['add'] / ROWS:.2f})" in logged
    pointer = Path(store.path("g", "_index", "v1.json")).read_text()
    first = shard_files(store)
    flip_bit(build_folder(store) / "_shards" / "shard-00001.faiss")  # same size, other bytes
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="raycompat.index.sharded"):
        build_version_index(store, "g", "v1", **OPTIONS)
    assert "index shard shard-00001 is redone" in caplog.text and "sha256" in caplog.text
    assert "g/v1: the add tasks (1 shard) spent" in caplog.text  # the redone shard's only
    again = shard_files(store)
    assert [n for n in first if again[n].st_ino != first[n].st_ino] == ["shard-00001.faiss"]
    assert Path(store.path("g", "_index", "v1.json")).read_text() == pointer


def test_loaded_index_is_memory_mapped_and_ids_are_not_materialised(gallery):
    store, ids, x = gallery
    build_version_index(store, "g", "v1", **OPTIONS)
    arrow_before = pa.total_allocated_bytes()
    index = load_version_index(store, "g", "v1", use_gpu=False)
    ivf = faiss.extract_index_ivf(index.index.index)
    assert isinstance(faiss.downcast_InvertedLists(ivf.invlists), faiss.OnDiskInvertedLists)
    assert isinstance(index.ids, MappedIds) and len(index.ids) == ROWS
    # zero-copy views of the memory-mapped file: no Arrow buffer, no object array of all ids
    assert pa.total_allocated_bytes() - arrow_before < 4096
    held = [v for v in vars(index.ids).values() if isinstance(v, np.ndarray)]
    assert all(v.dtype != object and v.size <= PARTS + 1 for v in held)
    _, found = index.search(x[[5, 3999]], 3)
    assert found[:, 0].tolist() == ["img-5", "img-3999"] and found.dtype == object
    assert index.ids[np.array([[0, 17]])].tolist() == [["img-0", "img-17"]]
    with pytest.raises(IndexError, match=r"\[0, 4000\)"):
        index.ids[np.array([ROWS])]


def test_load_checks_sizes_always_and_data_hashes_on_full_verify(gallery):
    store, _, x = gallery
    build_version_index(store, "g", "v1", **OPTIONS)
    folder = build_folder(store)
    flip_bit(folder / "index.ivfdata")  # a bit flip in the O(N) data: size-checked only
    load_version_index(store, "g", "v1", use_gpu=False)
    with pytest.raises(CorruptIndexError, match=r"index.ivfdata: expected sha256"):
        load_version_index(store, "g", "v1", use_gpu=False, verify="full")
    header = (folder / "index.faiss").read_bytes()
    flip_bit(folder / "index.faiss")  # small files are hashed on every load
    with pytest.raises(CorruptIndexError, match=r"index.faiss: expected sha256"):
        load_version_index(store, "g", "v1", use_gpu=False)
    (folder / "index.faiss").write_bytes(header)
    shards = shard_files(store)
    data = (folder / "ids.arrow").read_bytes()
    (folder / "ids.arrow").write_bytes(data[:-8])
    with pytest.raises(CorruptIndexError, match=f"ids.arrow: expected {len(data)} bytes"):
        load_version_index(store, "g", "v1", use_gpu=False)
    # a rebuild continues the same build folder: shards kept, merged files rewritten
    index = open_version_index(store, "g", "v1", rebuild=True, **OPTIONS)
    assert build_folder(store) == folder
    assert {n: s.st_ino for n, s in shard_files(store).items()} == {
        n: s.st_ino for n, s in shards.items()
    }
    load_version_index(store, "g", "v1", use_gpu=False, verify="full")
    assert index.search(x[[7]], 1)[1].tolist() == [["img-7"]]


def test_index_on_s3_is_copied_and_searched(s3_bucket, tmp_path):
    bucket, options = s3_bucket
    store, ids, x = (
        GalleryStore(f"s3://{bucket}/root", options),
        gallery_ids("int"),
        clustered(ROWS, 0),
    )
    publish(store, ids, x)
    uri = build_version_index(store, "g", "v1", **OPTIONS)
    assert uri.startswith(f"s3://{bucket}/root/g/_index/v1/{SHARDED_IVF}-")
    index = load_version_index(store, "g", "v1", use_gpu=False, verify="full")
    copy = Path(index.local_files.name)
    assert sorted(p.name for p in copy.iterdir()) == [
        "ids.arrow",
        "index.faiss",
        "index.faiss.json",
        "index.ivfdata",
    ]
    assert index.search(x[[11]], 1)[1].tolist() == [[11 * 7 + 3]]
    del index
    assert not copy.exists()  # the local copy lives as long as the loaded index


def test_cli_search_takes_nprobe(gallery, capsys):
    store, _, _ = gallery
    build_version_index(store, "g", "v1", **OPTIONS)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", "unused", WIDTH, method="independent"))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted"))
    base = ["search", "g", "--ids", "img-12", "--store", store.uri(), "--model", "m1"]
    assert cli([*base, "--nprobe", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["ids"][0] == "img-12"
    with pytest.raises(SystemExit):
        cli([*base, "--nprobe", "0"])
    assert "must be >= 1" in capsys.readouterr().err


def test_the_driver_dispatches_sampling_and_training_and_the_sample_is_removed(gallery):
    from raycompat.index.sharded import LocalTasks

    class Recording(LocalTasks):
        """In-process tasks that record which task functions ran and what they returned."""

        def __init__(self):
            self.ran = {}

        def map(self, fn, calls, **kwargs):
            out = super().map(fn, calls, **kwargs)
            self.ran[fn.__name__] = out
            return out

    store, _, x = gallery
    runner = Recording()
    build_version_index(store, "g", "v1", runner=runner, **OPTIONS)
    # the sample is read and k-means is run by tasks; the driver gets back only paths and a record
    assert {"write_sample", "train_template", "build_shard"} <= set(runner.ran)
    assert all(isinstance(p, str) and p.endswith(".npy") for p in runner.ran["write_sample"])
    [record] = runner.ran["train_template"]
    assert set(record) == {"bytes", "sha256", "nlist", "train_rows"}
    assert record["train_rows"] == min(ROWS, 64 * ivf_nlist(ROWS))
    assert not (build_folder(store) / "_sample").exists()
    template = json.loads((build_folder(store) / "_template.json").read_text())
    assert template == record
    # a run killed after recording the template but before the clean-up left its sample
    left = build_folder(store) / "_sample" / "shard-00000.npy"
    left.parent.mkdir()
    np.save(left, x[:3])
    rerun = Recording()
    build_version_index(store, "g", "v1", runner=rerun, **OPTIONS)
    assert "train_template" not in rerun.ran  # the recorded template is kept
    assert not left.parent.exists()


@pytest.mark.parametrize(
    "use_gpu, available, gpus",
    [(False, 1, 0), ("auto", 0, 0), ("auto", 2, 1), (True, 1, 1)],
)
def test_the_k_means_task_asks_for_a_gpu_only_when_the_runner_has_one(use_gpu, available, gpus):
    from raycompat.index.sharded import _training_gpus

    class Runner:
        def gpus_available(self):
            return available

    assert _training_gpus(Runner(), use_gpu) == gpus


def test_a_gpu_demanded_of_a_runner_without_one_is_refused_before_any_task(gallery, ray_local):
    store, _, _ = gallery
    runner = ray_tasks()
    assert runner.gpus_available() == 0  # the test cluster has CPUs only
    with pytest.raises(RuntimeError, match="use_gpu=True but the index runner has no GPU"):
        build_version_index(store, "g", "v1", runner=runner, **{**OPTIONS, "use_gpu": True})
    with pytest.raises(ValueError, match="use_gpu must be True, False or 'auto'"):
        build_version_index(store, "g", "v1", runner=runner, **{**OPTIONS, "use_gpu": "yes"})
