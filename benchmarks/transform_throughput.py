"""FCT transformation throughput: Ray Data pipeline vs a hand-written single-process baseline.

    .venv/bin/python benchmarks/transform_throughput.py --rows 1000000 3000000 \
        --out benchmarks/results/transform_throughput_cpu.json
    nice -n 5 .venv/bin/python benchmarks/transform_throughput.py --pairs 3 --rows 2000000 \
        --dim 64 --width 128 --no-side-info --out benchmarks/results/transform_cpu_cpu.json

For each N: publish an N-row version (128-d embedding + 128-d side info, float32, int ids) in
``--rows-per-file`` files, then on the same files measure
- ``raw_parquet``: pyarrow ``iter_batches`` -> ``ParquetWriter`` with no compute (the bound);
- ``baseline``: ``iter_batches`` -> torch h and g -> ``ParquetWriter``, one process, torch using
  ``actors x threads_per_actor`` threads (the same CPU count the Ray run gets);
- ``ray``: ``transform_version`` (actors, per-chunk parts, validation, publish with verification).
Peak RSS is the sum over the process tree (driver + raylet/GCS + Ray workers) sampled every
0.2 s with psutil; it counts shared object-store pages once per process that maps them.

``--pairs K`` measures CPU per row instead (issue 24, item 4; ``_transform_cpu.py``): K
interleaved rounds of the plain loop (1 and 2 torch threads) and ``transform_version``, the
ratios of their medians, and the CPU of each check and conversion on one batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402
from _transform_cpu import overheads, pairs  # noqa: E402

from raycompat.cluster.pipelines import RunOptions, apply_transformation, transform_version  # noqa: E402
from raycompat.store import GalleryStore, VersionInfo, embedding_table  # noqa: E402
from raycompat.transformations import (  # noqa: E402
    FCTTransformation,
    load_transformation,
    save_transformation,
    side_info_transformation,
)

D = 128


class PeakRSS:
    """Peak of the summed RSS of this process and all its descendants, sampled in a thread."""

    def __enter__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(0.2)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def make_source(
    root: str, rows: int, rows_per_file: int, dim: int = D, side_info: bool = True
) -> GalleryStore:
    store = GalleryStore(root)
    side = dim if side_info else None
    info = VersionInfo("v1", "m1", dim, False, "v1 = extract(m1)", side_info_width=side)
    staging = store.begin("bench", info, "init")
    rng = np.random.default_rng(0)
    for k, start in enumerate(range(0, rows, rows_per_file)):
        n = min(rows_per_file, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        x = rng.standard_normal((n, dim), dtype=np.float32)
        table = embedding_table(ids, x, x[:, ::-1] if side_info else None)
        staging.write_table(table, f"in-{k:04d}.parquet")
    staging.commit(expected_rows=rows)
    return store


def rewrite(files: list[str], out_dir: str, batch_size: int, fn=None) -> None:
    """Stream every file batch by batch through ``fn`` (or nothing) into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    for path in files:
        parquet, writer = pq.ParquetFile(path), None
        for batch in parquet.iter_batches(batch_size=batch_size):
            table = fn(batch) if fn else batch
            if writer is None:
                writer = pq.ParquetWriter(f"{out_dir}/{Path(path).name}", table.schema)
            writer.write(table)
        writer.close()


def timed(fn) -> tuple[float, int]:
    with PeakRSS() as rss:
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
    return seconds, rss.peak


def bench_one(rows: int, args: argparse.Namespace, threads: int) -> dict:
    """One N: make the source, then time raw Parquet, the baseline and the Ray pipeline."""
    tmp = tempfile.mkdtemp(prefix="transform_bench_", dir=os.environ.get("BENCH_TMP"))
    try:
        store = make_source(f"{tmp}/store", rows, args.rows_per_file)
        torch.manual_seed(0)
        save_transformation(f"{tmp}/fct", FCTTransformation(D, D, D, width=args.width), "h")
        save_transformation(f"{tmp}/fct", side_info_transformation(D, D, D, width=args.width), "g")
        files = [store.path("bench", f) for f in store.version("bench", "v1").files]
        torch.set_num_threads(threads)
        h, g = load_transformation(f"{tmp}/fct", "h"), load_transformation(f"{tmp}/fct", "g")

        raw_s, raw_rss = timed(lambda: rewrite(files, f"{tmp}/raw", args.batch_size))
        base_s, base_rss = timed(
            lambda: rewrite(
                files, f"{tmp}/base", args.batch_size, lambda b: apply_transformation(b, h, g)
            )
        )
        torch.set_num_threads(1)  # the driver only coordinates during the Ray run
        run = RunOptions(
            rows_per_file=args.rows_per_file,
            batch_size=args.batch_size,
            actors=args.actors,
            threads_per_actor=args.threads_per_actor,
            progress_every_s=30,
        )
        target = VersionInfo("v2", "m2", D, False, "v2 = h(v1)", side_info_width=D)
        ray_s, ray_rss = timed(
            lambda: transform_version(store, "bench", "v1", target, f"{tmp}/fct", f"{tmp}/fct", run)
        )
        entry = {
            "rows": rows,
            "files": len(files),
            "parquet_mb": round(sum(os.path.getsize(f) for f in files) / 1e6, 1),
            "raw_parquet_rows_per_s": rows / raw_s,
            "baseline_rows_per_s": rows / base_s,
            "ray_rows_per_s": rows / ray_s,
            "ray_over_baseline": base_s / ray_s,
            "peak_rss_mb": {
                "raw_parquet": raw_rss / 2**20,
                "baseline": base_rss / 2**20,
                "ray_process_tree": ray_rss / 2**20,
            },
            "seconds": {"raw_parquet": raw_s, "baseline": base_s, "ray": ray_s},
        }
        return entry
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_cpu(rows: int, args: argparse.Namespace) -> dict:
    """``--pairs``: CPU per row and rows/s of the transform against the plain loop at one N."""
    args.tmp = tempfile.mkdtemp(prefix="transform_cpu_", dir=os.environ.get("BENCH_TMP"))
    try:
        store = make_source(f"{args.tmp}/store", rows, args.rows_per_file, args.dim, args.side_info)
        torch.manual_seed(0)
        side = args.dim if args.side_info else 0
        save_transformation(
            f"{args.tmp}/fct", FCTTransformation(args.dim, side, args.dim, width=args.width), "h"
        )
        h = load_transformation(f"{args.tmp}/fct", "h")
        info = store.version("bench", "v1")
        files = [store.path("bench", f) for f in info.files]
        entry = {
            "rows": rows,
            "files": len(files),
            "overheads_us_per_row": overheads(files[0], info, h, args.batch_size),
        }
        print(json.dumps(entry), flush=True)
        return {**entry, **pairs(store, files, f"{args.tmp}/fct", h, args, rows)}
    finally:
        shutil.rmtree(args.tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--rows-per-file", type=int, default=250_000)
    parser.add_argument("--width", type=int, default=256, help="hidden width of h and g")
    parser.add_argument("--batch-size", type=int, default=16384)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--threads-per-actor", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/transform_throughput_cpu.json")
    parser.add_argument("--pairs", type=int, default=0, help="CPU-per-row rounds (0: off)")
    parser.add_argument("--dim", type=int, default=D, help="embedding width (--pairs)")
    parser.add_argument("--no-side-info", dest="side_info", action="store_false")
    args = parser.parse_args()

    import ray

    threads = args.actors * args.threads_per_actor
    ray.init(num_cpus=threads, include_dashboard=False, logging_level="WARNING")
    results = {"machine": machine_info(), "args": dict(vars(args)), "runs": []}
    results["load_average_at_start"] = os.getloadavg()
    for rows in args.rows:
        entry = bench_cpu(rows, args) if args.pairs else bench_one(rows, args, threads)
        print(json.dumps(entry), flush=True)
        results["runs"].append(entry)
    results["load_average_at_end"] = os.getloadavg()
    if len(results["runs"]) >= 2 and not args.pairs:
        small, large = results["runs"][0], results["runs"][-1]
        results["ray_peak_rss_ratio_largest_over_smallest"] = (
            large["peak_rss_mb"]["ray_process_tree"] / small["peak_rss_mb"]["ray_process_tree"]
        )
    emit(results, args.out)


if __name__ == "__main__":
    main()
