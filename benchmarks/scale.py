"""End to end as a version grows: FCT transform with its commit, sharded index build, search.

    .venv/bin/python benchmarks/scale.py --rows 1000000 4000000 16000000 --index-workers 1 2 \
        --out benchmarks/results/scale_cpu.json
    .venv/bin/python benchmarks/scale.py --narrow --rows 1000000 64000000 \
        --out benchmarks/results/scale_narrow_cpu.json

For each N, in a temporary local store, ``prepare`` (timed, not a measured stage) publishes the
old model's version v1: N unit rows x ``--width`` float32 around 1000 random centres, int64 ids,
part files of ``--part-rows`` rows (``index_scale.publish``; its commit reads every row back, so
this process's own memory grows with N, about 75 B/row). Then, each in a fresh Python process:

- ``transform``: ``ray.init(num_cpus=workers)`` and ``transform_version`` of v1 into v2 =
  h(v1), h an FCT transformation ``width -> width`` of hidden width ``--hidden`` (random init,
  seed 0, no side info, normalised output), ``workers`` actors of one thread. Reported:
  seconds, rows/s, us/row, and the commit's own seconds: from the ``verify`` hook, which the
  pipeline calls once every part is written, to ``Staging.commit``'s "published" log line (v1
  carries an id fingerprint, so the commit reads part records only, no rows).
- ``index``: ``index_scale``'s build script pointed at v2 (``build_version_index(kind=
  "sharded_ivf", runner=RayTasks(workers))``): seconds, us/row and its phases. At the smallest
  N it first builds once per other ``--index-workers`` count (from scratch each time), to show
  the add phase's rows/s as the workers grow.
- ``search`` (smallest N only): ``index_scale``'s search script pointed at v2: the index loaded
  memory-mapped, ``--queries`` queries (h of points drawn from the same centres), recall@10
  at the default ``nprobe`` (and a quarter and four times it) against exact neighbours from
  streaming v2 (``index_scale.exact_ids``).

Driver peak RSS is the measured process's VmHWM (what the driver ever held; ``ru_maxrss``
would carry the parent's peak across fork + exec), with its RSS after imports and ``ray.init``
as the baseline. Ray's worker processes (the transform's actors, the index's tasks) are not the
driver and are not counted. Reported at the end: largest N over smallest N per stage (rows, time
per row, driver peak RSS, and the RSS above the baseline at every N), and the targets: driver
peak RSS ratio <= 1.2 for transform and index, recall@10 >= 0.95 at the default ``nprobe``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402
from index_scale import BUILD, CENTRES, SEARCH, K, exact_ids, mixture, publish, run, unit  # noqa: E402

from raycompat.transformations import (  # noqa: E402
    FCTTransformation,
    load_transformation,
    save_transformation,
)

STAGES = ("transform", "index", "search")
RSS_RATIO_TARGET, RECALL_TARGET = 1.2, 0.95

TRANSFORM = """
import json, logging, sys, time
root, h_dir, width, workers, part_rows, batch_size = sys.argv[1:7]
def hwm_mb():
    with open("/proc/self/status") as handle:
        return int(next(x for x in handle if x.startswith("VmHWM:")).split()[1]) / 1024
import ray
from raycompat.cluster.pipelines import RunOptions, transform_version
from raycompat.store import GalleryStore, VersionInfo
marks = {}
class Marks(logging.Handler):
    def emit(self, record):
        name, message = record.name, record.getMessage()
        if name == "raycompat.store.commit.staging" and message.startswith("published"):
            marks["published"] = time.perf_counter()
logging.getLogger("raycompat").addHandler(Marks())
logging.getLogger("raycompat").setLevel(logging.INFO)
ray.init(num_cpus=int(workers), include_dashboard=False, log_to_driver=False)
baseline = hwm_mb()
run = RunOptions(rows_per_file=int(part_rows), batch_size=int(batch_size), actors=int(workers),
                 threads_per_actor=1, progress_every_s=60)
target = VersionInfo("v2", "bench-h", int(width), True, "v2 = h(v1)")
start = time.perf_counter()
summary = transform_version(GalleryStore(root), "bench", "v1", target, h_dir, run=run,
                            verify=lambda staging: marks.setdefault("parts", time.perf_counter()))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "parts_seconds": marks["parts"] - start,
                  "commit_seconds": marks["published"] - marks["parts"],
                  "files": len(summary["version"].files), "driver_peak_rss_mb": hwm_mb(),
                  "driver_baseline_rss_mb": baseline}))
"""


def build(root: str, rows: int, workers: int, rows_per_shard: int) -> dict:
    """One sharded build of v2 from scratch in a fresh process, as ``index_scale`` builds v1."""
    shutil.rmtree(Path(root, "bench", "_index"), ignore_errors=True)
    out = run(BUILD, root, str(workers), str(rows_per_shard), "v2")
    return {
        "workers": workers,
        "seconds": out["build_seconds"],
        "us_per_row": 1e6 * out["build_seconds"] / rows,
        "add_rows_per_s": rows / out["phases_s"]["add"],
        "driver_peak_rss_mb": out["driver_peak_rss_mb"],
        "driver_baseline_rss_mb": out["driver_baseline_rss_mb"],
        "phases_s": out["phases_s"],
    }


def measure(rows: int, smallest: bool, args: argparse.Namespace, centres: np.ndarray) -> dict:
    """Every requested stage at one N, in a temporary store."""
    entry: dict = {"rows": rows}
    with tempfile.TemporaryDirectory() as tmp:
        root, h_dir = str(Path(tmp, "store")), str(Path(tmp, "h"))
        start = time.perf_counter()
        publish(root, rows, args.width, args.part_rows, centres)
        entry["prepare_seconds"] = time.perf_counter() - start
        if "transform" in args.stages:
            torch.manual_seed(0)
            h = FCTTransformation(
                args.width, 0, args.width, width=args.hidden, normalize_output=True
            )
            save_transformation(h_dir, h, "h")
            out = run(
                TRANSFORM,
                root,
                h_dir,
                str(args.width),
                str(args.workers),
                str(args.part_rows),
                str(args.batch_size),
            )
            entry["transform"] = {
                **out,
                "rows_per_s": rows / out["seconds"],
                "us_per_row": 1e6 * out["seconds"] / rows,
            }
        if "search" in args.stages and smallest:
            start = time.perf_counter()
            with torch.inference_mode():
                old = mixture(np.random.default_rng(2), centres, args.queries)
                queries = load_transformation(h_dir, "h")(torch.from_numpy(old)).numpy()
            np.save(Path(tmp, "q.npy"), queries)
            np.save(Path(tmp, "truth.npy"), exact_ids(root, queries, K, "v2"))
            exact_s = time.perf_counter() - start
        if "index" in args.stages:
            others = [w for w in args.index_workers if w != args.workers] if smallest else []
            if others:  # built first: the search stage reads the last build, with --workers
                entry["index_other_workers"] = [
                    build(root, rows, w, args.rows_per_shard) for w in others
                ]
            entry["index"] = build(root, rows, args.workers, args.rows_per_shard)
            if smallest:
                builds = [*entry.get("index_other_workers", []), entry["index"]]
                entry["add_rows_per_s_by_workers"] = {
                    b["workers"]: b["add_rows_per_s"] for b in builds
                }
        if "search" in args.stages and smallest:
            out = run(SEARCH, root, str(Path(tmp, "q.npy")), str(Path(tmp, "truth.npy")), "v2")
            default = out["nprobe_default"]
            entry["search"] = {
                **out,
                "exact_seconds": exact_s,
                "recall_at_10_default": out["recall_at_10"][str(default)],
            }
    return entry


def ratios(runs: list[dict], stage: str) -> dict | None:
    """Largest N over smallest N for one stage (None when it ran at fewer than two sizes)."""
    mine = [(r["rows"], r[stage]) for r in runs if stage in r]
    if len(mine) < 2:
        return None
    (small_rows, small), (large_rows, large) = mine[0], mine[-1]
    out = {
        "rows_ratio": large_rows / small_rows,
        "us_per_row_ratio": large["us_per_row"] / small["us_per_row"],
        "driver_peak_rss_ratio": large["driver_peak_rss_mb"] / small["driver_peak_rss_mb"],
        "driver_rss_above_baseline_mb": [
            s["driver_peak_rss_mb"] - s["driver_baseline_rss_mb"] for _, s in mine
        ],
    }
    if stage == "transform":
        out["commit_seconds_ratio"] = large["commit_seconds"] / small["commit_seconds"]
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    parser.add_argument("--width", type=int, default=None, help="default 32 (8 with --narrow)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden width of h")
    parser.add_argument("--part-rows", type=int, default=250_000)
    parser.add_argument("--batch-size", type=int, default=65536, help="rows per call of h")
    parser.add_argument("--rows-per-shard", type=int, default=500_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--index-workers",
        type=int,
        nargs="+",
        default=None,
        help="worker counts to build with at the smallest N (default --workers)",
    )
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--stages",
        nargs="+",
        choices=STAGES,
        default=None,
        help="default all (transform only with --narrow)",
    )
    parser.add_argument(
        "--narrow", action="store_true", help="the narrow-rows run: --width 8 --stages transform"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.width = args.width or (8 if args.narrow else 32)
    args.stages = args.stages or (["transform"] if args.narrow else list(STAGES))
    args.index_workers = args.index_workers or [args.workers]
    for stage, needs in (("index", "transform"), ("search", "index")):
        if stage in args.stages and needs not in args.stages:
            parser.error(f"stage {stage} needs stage {needs}")
    args.rows = sorted(args.rows)
    centres = unit(np.random.default_rng(0).normal(size=(CENTRES, args.width)))
    runs = []
    for rows in args.rows:
        runs.append(measure(rows, rows == args.rows[0], args, centres))
        print(json.dumps(runs[-1]), file=sys.stderr)
    largest_over_smallest = {s: ratios(runs, s) for s in ("transform", "index")}
    recall = runs[0].get("search", {}).get("recall_at_10_default")
    targets = {
        f"{s}_driver_peak_rss_ratio_le_{RSS_RATIO_TARGET}": None
        if largest_over_smallest[s] is None
        else largest_over_smallest[s]["driver_peak_rss_ratio"] <= RSS_RATIO_TARGET
        for s in ("transform", "index")
    }
    targets[f"recall_at_10_default_nprobe_ge_{RECALL_TARGET}"] = (
        None if recall is None else recall >= RECALL_TARGET
    )
    result = {
        "benchmark": "scale",
        "machine": machine_info(),
        "width": args.width,
        "hidden": args.hidden,
        "workers": args.workers,
        "part_rows": args.part_rows,
        "batch_size": args.batch_size,
        "rows_per_shard": args.rows_per_shard,
        "stages": args.stages,
        "runs": runs,
        "largest_over_smallest": largest_over_smallest,
        "targets": targets,
    }
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
