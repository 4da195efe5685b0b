"""Sharded IVF index build and search as a version grows: time per row, driver peak RSS, recall.

    .venv/bin/python benchmarks/index_scale.py --rows 1000000 4000000 16000000 \
        --out benchmarks/results/index_scale_cpu.json

For each N a cosine version of N x ``--width`` rows (unit vectors around 1000 random centres,
int64 ids, part files of ``--part-rows`` rows) is published in a temporary local store. Then,
each in a fresh Python process:

- ``build``: ``ray.init`` and ``build_version_index(kind="sharded_ivf",
  runner=RayTasks(workers))`` (default shards unless ``--rows-per-shard``); reported: seconds
  (and per row) after ``ray.init``, the phases from the build's log lines (plan + sample +
  train, add, merge + publish), the add phase's wall time per row and per row and task, the
  coarse quantizer (``flat`` or ``hnsw``, from the pointer), the shards, what the add tasks
  spent per row reading, adding and writing (``add_task_us_per_row``, from the shard records'
  seconds: one task's cost, whatever ran beside it), and the driver's peak
  RSS (VmHWM: what the driver process ever held; ``ru_maxrss`` would carry the parent's peak
  across fork + exec), with the RSS after ``ray.init`` as the baseline. Ray's worker processes
  are not the driver and are not counted.
- ``baseline`` (the smallest N only, ``--repeats`` interleaved build + baseline pairs, each
  build from scratch; the median build, the median baseline and the median of the pairs'
  ratios are reported, with every pair): what a user would write with faiss alone, in one process
  on all threads: read the version into memory (``iter_batches``), train an IVF-Flat of the
  same ``nlist`` and quantizer on the same sampled rows, add every row. Reported: its seconds
  (read, train, add) and the build's time over it.
- ``search``: ``load_version_index`` (memory-mapped lists, ids) and ``--queries`` queries drawn
  from the same centres: batch latency per query, single-query median latency, and recall@10
  against exact search (computed here by streaming the version) at the default ``nprobe`` and
  at a quarter and four times it; peak RSS of the searching process.

Reported at the end: largest N over smallest N for time per row, add time per row (the median
add phase of the smallest N's builds) and driver peak RSS; the build over the single-process
baseline at the smallest N.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.store import GalleryStore, VersionInfo, embedding_table  # noqa: E402

CENTRES, NOISE, K = 1000, 1.0, 10

BUILD = """
import glob, json, logging, sys, time
root, version, quantizer = sys.argv[1], sys.argv[4], sys.argv[5]
workers, rows_per_shard = int(sys.argv[2]), int(sys.argv[3]) or None
def hwm_mb():
    with open("/proc/self/status") as handle:
        return int(next(x for x in handle if x.startswith("VmHWM:")).split()[1]) / 1024
import ray
from raycompat.cluster.pipelines.index import RayTasks
from raycompat.store import GalleryStore
from raycompat.index.version_index import build_version_index
marks = []
class Marks(logging.Handler):
    def emit(self, record):
        marks.append((time.perf_counter(), record.name, record.getMessage()))
logging.getLogger("raycompat").addHandler(Marks())
logging.getLogger("raycompat").setLevel(logging.INFO)
ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
baseline = hwm_mb()
start = time.perf_counter()
build_version_index(GalleryStore(root), "bench", version, kind="sharded_ivf", use_gpu=False,
                    runner=RayTasks(workers=workers), rows_per_shard=rows_per_shard,
                    quantizer=quantizer)
seconds = time.perf_counter() - start
pointer = json.load(open(f"{root}/bench/_index/{version}.json"))
def at(text, last=False):
    hits = [t for t, _, m in marks if text in m]
    return (hits[-1] if last else hits[0]) - start
trained, add_start = at("trained"), at("to build")
add_end = at("add:", last=True)
shards = [json.load(open(p)) for p in
          glob.glob(f"{root}/bench/_index/{version}/{pointer['build']}/_shards/*.json")]
task_us = {p: 1e6 * sum(r["seconds"][p] for r in shards) / sum(r["rows"] for r in shards)
           for p in ("read", "add", "write")}
print(json.dumps({"build_seconds": seconds, "driver_peak_rss_mb": hwm_mb(),
                  "add_task_us_per_row": task_us,
                  "quantizer": pointer["quantizer"], "shards": pointer["shards"],
                  "nlist_built": pointer["nlist"],
                  "driver_baseline_rss_mb": baseline,
                  "phases_s": {"plan_sample_train": trained, "check_shards": add_start - trained,
                               "add": add_end - add_start, "merge_publish": seconds - add_end}}))
"""

SEARCH = """
import json, sys, time
import numpy as np
root, queries_path, truth_path, version = sys.argv[1:5]
from raycompat.store import GalleryStore
from raycompat.index.version_index import load_version_index
def hwm_mb():
    with open("/proc/self/status") as handle:
        return int(next(x for x in handle if x.startswith("VmHWM:")).split()[1]) / 1024
queries, truth = np.load(queries_path), np.load(truth_path)
start = time.perf_counter()
index = load_version_index(GalleryStore(root), "bench", version, use_gpu=False)
load_s = time.perf_counter() - start
default = int(index.index.index.nprobe)
index.search(queries[:8], 10)  # touch the code paths once
out = {"load_seconds": load_s, "nlist": int(index.index.index.nlist), "nprobe_default": default,
       "recall_at_10": {}, "batch_ms_per_query": {}}
for nprobe in sorted({max(1, default // 4), default, default * 4}):
    start = time.perf_counter()
    _, ids = index.search(queries, 10, nprobe=nprobe)
    out["batch_ms_per_query"][nprobe] = 1000 * (time.perf_counter() - start) / len(queries)
    out["recall_at_10"][nprobe] = float(np.mean(
        [len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(), truth.tolist())]))
single = []
for q in queries[:50]:
    start = time.perf_counter()
    index.search(q[None], 10)
    single.append(time.perf_counter() - start)
out["single_query_ms_median"] = 1000 * float(np.median(single))
out["search_peak_rss_mb"] = hwm_mb()
print(json.dumps(out))
"""


BASELINE = """
import json, sys, time
import faiss, numpy as np
root, version = sys.argv[1:3]
from raycompat.store import GalleryStore
from raycompat.index.factory import INDEX_KINDS
from raycompat.index.ivf import SHARDED_IVF
from raycompat.index.sharded import TRAIN_PER_LIST, sample_rows
pointer = json.load(open(f"{root}/bench/_index/{version}.json"))
start = time.perf_counter()
store = GalleryStore(root)
x = np.concatenate([b.column("embedding").flatten().to_numpy().reshape(b.num_rows, -1)
                    for b in store.iter_batches("bench", version, batch_size=262144)])
read = time.perf_counter() - start
nlist = pointer["nlist"]
train = x[sample_rows(len(x), min(len(x), TRAIN_PER_LIST * nlist), 0)]
start = time.perf_counter()
index = INDEX_KINDS.create(SHARDED_IVF, dim=x.shape[1], metric=faiss.METRIC_INNER_PRODUCT,
                           train=train, seed=0, nlist=nlist, quantizer=pointer["quantizer"])
index.train(train)
trained = time.perf_counter() - start
start = time.perf_counter()
index.add(x)
added = time.perf_counter() - start
print(json.dumps({"threads": faiss.omp_get_max_threads(), "read_s": read, "train_s": trained,
                  "add_s": added, "seconds": read + trained + added,
                  "add_us_per_row": 1e6 * added / len(x)}))
"""


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def mixture(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    """Unit rows: a random centre plus isotropic noise of norm about ``NOISE``."""
    picked = centres[rng.integers(0, len(centres), n)]
    noise = rng.normal(size=picked.shape).astype(np.float32) * (NOISE / np.sqrt(picked.shape[1]))
    return unit(picked + noise)


def publish(root: str, rows: int, width: int, part_rows: int, centres: np.ndarray) -> None:
    store = GalleryStore(root)
    staging = store.begin("bench", VersionInfo("v1", "bench", width, True, "v1 = bench"))
    rng = np.random.default_rng(1)
    for part, start in enumerate(range(0, rows, part_rows)):
        n = min(part_rows, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        staging.write_table(embedding_table(ids, mixture(rng, centres, n)), f"p-{part:05d}.parquet")
    staging.commit(expected_rows=rows)


def exact_ids(root: str, queries: np.ndarray, k: int, version: str = "v1") -> np.ndarray:
    """Exact top-k ids by streaming the version (float32 dot products, running top-k)."""
    best_s = np.full((len(queries), k), -np.inf, np.float32)
    best_i = np.full((len(queries), k), -1, np.int64)
    store = GalleryStore(root)
    for batch in store.iter_batches("bench", version, batch_size=262144):
        x = batch.column("embedding").flatten().to_numpy().reshape(batch.num_rows, -1)
        ids = batch.column("id").to_numpy()
        scores = np.concatenate([best_s, queries @ x.T], axis=1)
        every = np.concatenate([best_i, np.broadcast_to(ids, (len(queries), len(ids)))], axis=1)
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(scores, top, 1), np.take_along_axis(every, top, 1)
    return best_i


def run(script: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", script, *args], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_run(results: list[dict], key) -> dict:
    """The result whose ``key`` is the median (the lower middle one of an even count)."""
    return sorted(results, key=key)[(len(results) - 1) // 2]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--part-rows", type=int, default=250_000)
    parser.add_argument("--rows-per-shard", type=int, default=0, help="0: the build's default")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quantizer", default="auto", choices=["auto", "flat", "hnsw"])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="build + baseline pairs at the smallest N (medians reported)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    centres = unit(rng.normal(size=(CENTRES, args.width)))
    queries = mixture(np.random.default_rng(2), centres, args.queries)
    runs = []
    for rows in args.rows:
        with tempfile.TemporaryDirectory() as tmp:
            root = str(Path(tmp, "store"))
            start = time.perf_counter()
            publish(root, rows, args.width, args.part_rows, centres)
            np.save(Path(tmp, "q.npy"), queries)
            np.save(Path(tmp, "truth.npy"), exact_ids(root, queries, K))
            prepared = time.perf_counter() - start
            shards = str(args.rows_per_shard)
            builds, baselines = [], []
            for k in range(args.repeats if not runs else 1):  # interleaved pairs, smallest N
                if k:
                    shutil.rmtree(Path(root, "bench", "_index"))  # a fresh build, not a resume
                builds.append(run(BUILD, root, str(args.workers), shards, "v1", args.quantizer))
                if not runs:  # the same version, nlist, sample and quantizer, faiss alone
                    baselines.append(run(BASELINE, root, "v1"))
            build = median_run(builds, lambda b: b["build_seconds"])
            if baselines:
                pairs = list(zip(builds, baselines, strict=True))
                ratios = [b["build_seconds"] / f["seconds"] for b, f in pairs]
                build["baseline"] = median_run(baselines, lambda f: f["seconds"])
                build["over_baseline"] = float(np.median(ratios))
                build["pairs"] = [
                    {"build_s": b["build_seconds"], "baseline_s": f["seconds"], "ratio": r}
                    for (b, f), r in zip(pairs, ratios, strict=True)
                ]
            search = run(SEARCH, root, str(Path(tmp, "q.npy")), str(Path(tmp, "truth.npy")), "v1")
            index_dir = Path(root, "bench", "_index", "v1")
            disk = sum(p.stat().st_size for p in index_dir.rglob("*") if p.is_file())
            adds = [b["phases_s"]["add"] for b in builds]  # median over the pairs' builds
            runs.append(
                {
                    "rows": rows,
                    **build,
                    "build_us_per_row": 1e6 * build["build_seconds"] / rows,
                    "add_s_builds": adds,
                    "add_us_per_row": 1e6 * float(np.median(adds)) / rows,
                    "add_us_per_row_task": 1e6 * float(np.median(adds)) * args.workers / rows,
                    **search,
                    "index_disk_mb": disk / 2**20,
                    "prepare_seconds": prepared,
                }
            )
            print(json.dumps(runs[-1]), file=sys.stderr)
    small, large = runs[0], runs[-1]
    result = {
        "benchmark": "index_scale",
        "machine": machine_info(),
        "width": args.width,
        "workers": args.workers,
        "part_rows": args.part_rows,
        "rows_per_shard": args.rows_per_shard or "default",
        "quantizer": args.quantizer,
        "runs": runs,
        "build_over_single_process_faiss": small["over_baseline"],
        "largest_over_smallest": {
            "rows_ratio": large["rows"] / small["rows"],
            "us_per_row_ratio": large["build_us_per_row"] / small["build_us_per_row"],
            "add_us_per_row_ratio": large["add_us_per_row"] / small["add_us_per_row"],
            "quantizers": [r["quantizer"] for r in runs],
            "driver_peak_rss_ratio": large["driver_peak_rss_mb"] / small["driver_peak_rss_mb"],
            "driver_rss_above_baseline_mb": [
                r["driver_peak_rss_mb"] - r["driver_baseline_rss_mb"] for r in runs
            ],
        },
    }
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
