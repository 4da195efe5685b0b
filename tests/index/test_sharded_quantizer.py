"""The sharded IVF build's coarse quantizer (flat or HNSW over the centroids), its default
shards (at least one per worker) and the k-means task's resources (raycompat/index/sharded.py,
shard_tasks.py, factory.py)."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest

from raycompat.index.distances import get_distance
from raycompat.index.ivf import HNSW_EF_ADD, HNSW_M
from raycompat.index.sharded import (
    BuildPlan,
    LocalTasks,
    default_shards,
    plan_build,
    training_resources,
)
from raycompat.index.version_index import build_version_index, load_version_index
from raycompat.store import GalleryStore, VersionInfo, embedding_table

ROWS, WIDTH, PARTS = 4000, 16, 8
OPTIONS = dict(flat_max_rows=1000, use_gpu=False)

pytestmark = pytest.mark.usefixtures("one_faiss_thread")


def clustered(n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """Rows around 40 fixed centres; unit rows when ``scale`` is 1, else scaled (l2)."""
    centres = np.random.default_rng(99).normal(size=(40, WIDTH))
    rng = np.random.default_rng(seed)
    x = centres[rng.integers(0, 40, n)] + 0.3 * rng.normal(size=(n, WIDTH))
    return (scale * x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def publish(root: Path, x: np.ndarray, normalized: bool) -> GalleryStore:
    store = GalleryStore(str(root))
    staging = store.begin("g", VersionInfo("v1", "m1", WIDTH, normalized, "v1 = extract(m1)"))
    step = ROWS // PARTS
    for p in range(PARTS):
        rows = np.arange(p * step, (p + 1) * step)
        staging.write_table(embedding_table(rows, x[rows]), f"part-{p:05d}.parquet")
    staging.commit(expected_rows=ROWS)
    return store


class Recording(LocalTasks):
    """In-process tasks with a runner's spec: ``workers``, ``node_cpus``; records each map."""

    def __init__(self, workers: int = 1, cpus: int | None = None, gpus: int = 0):
        self.workers, self.cpus, self.gpus, self.calls = workers, cpus, gpus, {}

    def node_cpus(self) -> int | None:
        return self.cpus

    def gpus_available(self) -> int:
        return self.gpus

    def map(self, fn, calls, **kwargs):
        self.calls[fn.__name__] = (calls, kwargs)
        return super().map(fn, calls, **kwargs)


@pytest.fixture(scope="module")
def cosine_store(tmp_path_factory):
    return publish(tmp_path_factory.mktemp("cosine"), clustered(ROWS, 0), True)


@pytest.mark.parametrize("distance, scale", [("cosine", 1.0), ("l2", 3.0)])
def test_hnsw_quantizer_merges_on_disk_and_recalls_like_exact_search(tmp_path, distance, scale):
    x = clustered(ROWS, 0, scale)
    store = publish(tmp_path, x, normalized=distance == "cosine")
    build_version_index(store, "g", "v1", quantizer="hnsw", rows_per_shard=1000, **OPTIONS)
    pointer = json.loads(Path(store.path("g", "_index", "v1.json")).read_text())
    assert pointer["quantizer"] == "hnsw" and pointer["shards"] == 4 and pointer["nlist"] == 64
    folder = Path(store.path("g", "_index", "v1", pointer["build"]))
    assert json.loads((folder / "_template.json").read_text())["quantizer"] == "hnsw"
    index = load_version_index(store, "g", "v1", use_gpu=False)
    ivf = faiss.extract_index_ivf(index.index.index)
    graph = faiss.downcast_index(ivf.quantizer)
    assert isinstance(graph, faiss.IndexHNSWFlat) and graph.hnsw.nb_neighbors(1) == HNSW_M
    assert graph.hnsw.efSearch == HNSW_EF_ADD  # as the rows were added; a search raises it
    assert isinstance(faiss.downcast_InvertedLists(ivf.invlists), faiss.OnDiskInvertedLists)
    queries = clustered(100, 1, scale)
    scores = queries @ x.T  # unit rows for cosine
    if distance == "l2":
        scores = 2 * scores - (x * x).sum(1)  # -||q - g||^2 + ||q||^2
    exact = np.argsort(-scores, axis=1)[:, :10]
    _, found = index.search(queries, 10)  # default nprobe: 16 of 64 lists
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact, strict=True)])
    assert recall >= 0.95


def test_an_hnsw_quantizer_finds_all_the_lists_it_is_asked_to_probe(cosine_store):
    # 256 lists: the graph's efSearch (16) is raised to nprobe; with 16 it finds ~2/3 of them
    build_version_index(cosine_store, "g", "v1", quantizer="hnsw", nlist=256, **OPTIONS)
    index = load_version_index(cosine_store, "g", "v1", use_gpu=False)
    _, every = index.search(clustered(3, 1), ROWS, nprobe=256)
    assert (np.sort(every, axis=1) == np.arange(ROWS)).all()


def test_a_flat_build_keeps_its_identity_and_folder_name(cosine_store):
    info = cosine_store.version("g", "v1")
    dist = get_distance("cosine")
    flat = plan_build(cosine_store, "g", info, dist, quantizer="flat")
    auto = plan_build(cosine_store, "g", info, dist)  # 64 lists: flat
    hnsw = plan_build(cosine_store, "g", info, dist, quantizer="hnsw")
    assert "quantizer" not in flat.identity and flat.ctx.build == auto.ctx.build
    assert hnsw.identity["quantizer"] == "hnsw" and hnsw.ctx.build != flat.ctx.build
    # a build whose graph adds otherwise (M = 32, efSearch 16 before issue 24) is another folder
    assert hnsw.identity["hnsw"] == {"m": HNSW_M, "ef_add": HNSW_EF_ADD}


def test_default_shards_are_at_least_one_per_worker():
    assert default_shards(1_000_000, 32, 1) == 1  # 136 MB of vectors: under SHARD_BYTES
    assert [default_shards(1_000_000, 32, w) for w in (2, 3, 4)] == [2, 3, 4]
    assert default_shards(4_000_000, 32, 2) == 4  # 3 by size, rounded to whole waves
    assert default_shards(16_000_000, 32, 2) == 10
    assert default_shards(3, 32, 4) == 3  # never more shards than rows


@pytest.mark.parametrize("workers", [2, 4])
def test_the_plan_gives_each_worker_a_shard_of_whole_parts(cosine_store, workers):
    info = cosine_store.version("g", "v1")
    plan: BuildPlan = plan_build(cosine_store, "g", info, get_distance("cosine"), workers=workers)
    assert len(plan.shards) == workers
    assert [s.rows for s in plan.shards] == [ROWS // workers] * workers
    assert [f for s in plan.shards for f in s.files] == list(info.files)  # no part split
    assert all(set(s.file_rows) == {ROWS // PARTS} for s in plan.shards)
    # 8 parts over 3 workers: shards end at the first part reaching each third
    three = plan_build(cosine_store, "g", info, get_distance("cosine"), workers=3)
    assert [s.rows for s in three.shards] == [1500, 1500, 1000]


def test_the_k_means_task_reserves_a_node_and_uses_its_threads(cosine_store):
    runner = Recording(workers=2, cpus=2)
    build_version_index(cosine_store, "g", "v1", runner=runner, build="node", **OPTIONS)
    [(_, _, training)], kwargs = runner.calls["train_template"]
    assert kwargs["cpus"] == 2 and kwargs["gpus"] == 0 and training.threads == 2
    assert runner.calls["build_shard"][1].get("cpus") is None  # adds keep their share
    assert len(runner.calls["build_shard"][0]) == 2  # one shard per worker
    assert faiss.omp_get_max_threads() == 1  # the task restored the process's threads
    # with a GPU the task asks for it and keeps its CPU share; a runner without node_cpus
    # gives its share too
    assert training_resources(Recording(cpus=16, gpus=1), "auto") == (1, None)
    assert training_resources(Recording(cpus=16, gpus=1), False) == (0, 16)
    assert training_resources(LocalTasks(), "auto")[1] is None
