"""Transform pipeline against raw Parquet read + write of the same files (issue 38, item 3 (d)).

    nice -n 5 .venv/bin/python benchmarks/transform_pipeline.py --size 200000 800000 \
        --out benchmarks/results/transform_pipeline_cpu.json

For each size N: publish N rows (``--dim``-d embedding and side info, float32, int64 ids) in
files of ``--rows-per-file`` rows; h and g are FCT MLPs of hidden width ``--width`` (8: the
compute is nearly free, so the benchmark measures what the pipeline adds over its I/O). Then
``--pairs`` interleaved rounds of:

- ``raw``: what a user would write with plain pyarrow: P fresh processes (``python -c``,
  pyarrow only), each reading its share of the files with ``pq.ParquetFile.iter_batches`` and
  writing them back with ``pq.ParquetWriter`` (its defaults); wall time from the first start
  to the last exit, CPU of those processes;
- ``transform``: ``transform_version`` with ``pool="auto"`` (``pool.py``: P actors x 1 thread
  on P CPUs), every input and output check, page checksums, part hashes and the verified
  publish included; CPU of the whole process tree (``_transform_cpu.TreeCPU``: driver, Ray's
  processes, actors) and the actors' CPU on their chunks (``actor_cpu_s``);
- ``compute``: h and g on tensors already in memory, 1 torch thread, same batch size (the
  ceiling of P processes is P times its rate).

P is the CPU count given to Ray (``--processes``, default the machine's). Reported: medians of
rows/s and of CPU us/row; transform / raw per size, and at the margin between the smallest and
largest size (``(N2 - N1) / (t2 - t1)``: the fixed costs, Ray's actor start-up above all,
cancel); transform / compute; largest over smallest size of the transform's time per row and of
the driver's peak RSS (median over the rounds, sampled every 0.1 s; the scale rule: nothing on
the driver grows with rows), and the most the driver's RSS grew during one transform. Wall
times on a shared machine move with its load (``load_1min`` per round); CPU per row much less.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import DriverRSS, emit, machine_info  # noqa: E402
from _transform_cpu import TreeCPU  # noqa: E402
from transform_throughput import make_source  # noqa: E402

from raycompat.cluster.pipelines import RunOptions, transform_version  # noqa: E402
from raycompat.store import VersionInfo  # noqa: E402
from raycompat.transformations import (  # noqa: E402
    FCTTransformation,
    load_transformation,
    save_transformation,
    side_info_transformation,
)

# One raw process: its files, batch by batch, through ParquetWriter's defaults.
RAW_PROCESS = """
import sys, pyarrow.parquet as pq
out, batch_size, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for path in files:
    parquet = pq.ParquetFile(path)
    with pq.ParquetWriter(out + "/" + path.rsplit("/", 1)[1], parquet.schema_arrow) as writer:
        for batch in parquet.iter_batches(batch_size=batch_size):
            writer.write_batch(batch)
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def raw(files: list[str], out_dir: str, processes: int, batch_size: int) -> dict:
    """P plain pyarrow processes rewrite ``files`` (round-robin shares): wall and CPU seconds."""
    os.makedirs(out_dir)
    start, cpu = time.perf_counter(), _children_cpu()
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", RAW_PROCESS, out_dir, str(batch_size), *files[k::processes]]
        )
        for k in range(processes)
        if files[k::processes]
    ]
    if any(w.wait() for w in workers):
        raise RuntimeError("a raw Parquet process failed")
    result = {"seconds": time.perf_counter() - start, "cpu_s": _children_cpu() - cpu}
    shutil.rmtree(out_dir)
    return result


def transform(store, fct: str, dim: int, round_: int, run: RunOptions) -> dict:
    """``transform_version`` of v1 into a new version: wall, CPU, driver peak RSS."""
    target = VersionInfo(f"t{round_}", "m2", dim, False, "t = h(v1)", side_info_width=dim)
    with DriverRSS() as rss, TreeCPU() as tree:
        start = time.perf_counter()
        summary = transform_version(store, "bench", "v1", target, fct, fct, run, f"t{round_}")
        seconds = time.perf_counter() - start
    # the output's files (its record stays; nothing reads it again): one output on disk at most
    shutil.rmtree(store.path("bench", f"_data/t{round_}"), ignore_errors=True)
    return {
        "seconds": seconds,
        "cpu_s": tree.total,
        "cpu_s_by_process": tree.by_kind,
        "actor_chunk_cpu_s": summary["actor_cpu_s"],
        "driver_peak_rss_mb": rss.peak / 2**20,
        "driver_rss_growth_mb": (rss.peak - rss.start) / 2**20,
    }


def compute(h, g, rows: int, dim: int, batch_size: int) -> float:
    """Seconds of h and g over ``rows`` rows already in memory, 1 thread, after a warm-up."""
    x, side = torch.randn(batch_size, dim), torch.randn(batch_size, dim)
    with torch.inference_mode():
        h(x, side), g(x, side)
        start = time.perf_counter()
        for _ in range(0, rows, batch_size):
            h(x, side), g(x, side)
        return time.perf_counter() - start


def bench_size(rows: int, args: argparse.Namespace) -> dict:
    """One size: make the source, then ``args.pairs`` rounds of raw, transform and compute."""
    tmp = tempfile.mkdtemp(prefix="transform_pipeline_", dir=os.environ.get("BENCH_TMP"))
    try:
        store = make_source(f"{tmp}/store", rows, args.rows_per_file, args.dim)
        torch.manual_seed(0)
        d, fct = args.dim, f"{tmp}/fct"
        save_transformation(fct, FCTTransformation(d, d, d, width=args.width), "h")
        save_transformation(fct, side_info_transformation(d, d, d, width=args.width), "g")
        h, g = load_transformation(fct, "h"), load_transformation(fct, "g")
        files = [store.path("bench", f) for f in store.version("bench", "v1").files]
        parquet_mb = sum(os.path.getsize(f) for f in files) / 1e6
        run = RunOptions(
            rows_per_file=args.rows_per_file,
            batch_size=args.batch_size,
            pool="auto",
            progress_every_s=60,
        )
        rounds = []
        for k in range(args.pairs):
            rounds.append(
                {
                    "load_1min": os.getloadavg()[0],
                    "raw": raw(files, f"{tmp}/raw", args.processes, args.batch_size),
                    "transform": transform(store, fct, d, k, run),
                    "compute_1_thread_s": compute(h, g, rows, d, args.batch_size),
                }
            )
            print(rows, rounds[-1], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "rows": rows,
        "files": len(files),
        "parquet_mb": round(parquet_mb, 1),
        **summarise_size(rounds, rows, args.processes),
        "driver_peak_rss_mb": statistics.median(
            r["transform"]["driver_peak_rss_mb"] for r in rounds
        ),
        "driver_rss_growth_mb": max(r["transform"]["driver_rss_growth_mb"] for r in rounds),
        "rounds": rounds,
    }


def summarise_size(rounds: list[dict], rows: int, processes: int) -> dict:
    """Medians over the rounds of one size, and the ratios."""

    def med(step: str, key: str) -> float:
        return statistics.median(r[step][key] for r in rounds)

    seconds = {
        "raw": med("raw", "seconds"),
        "transform": med("transform", "seconds"),
        "compute_1_thread": statistics.median(r["compute_1_thread_s"] for r in rounds),
    }
    rates = {step: rows / s for step, s in seconds.items()}
    rates["compute_ceiling"] = processes * rates["compute_1_thread"]
    us = 1e6 / rows
    cpu = {
        "raw": med("raw", "cpu_s") * us,
        "transform_actor_chunks": med("transform", "actor_chunk_cpu_s") * us,
        "transform_end_to_end": med("transform", "cpu_s") * us,
    }
    return {
        "seconds": seconds,
        "rows_per_s": rates,
        "cpu_us_per_row": cpu,
        "transform_over_raw": rates["transform"] / rates["raw"],
        "transform_over_raw_median_of_pairs": statistics.median(
            r["raw"]["seconds"] / r["transform"]["seconds"] for r in rounds
        ),
        "transform_over_compute_ceiling": rates["transform"] / rates["compute_ceiling"],
        "cpu_per_row_actor_chunks_over_raw": cpu["transform_actor_chunks"] / cpu["raw"],
        "cpu_per_row_end_to_end_over_raw": cpu["transform_end_to_end"] / cpu["raw"],
    }


def summarise(runs: list[dict]) -> dict:
    """Margin between the smallest and largest size, and the scale rule's ratios."""
    small, large = runs[0], runs[-1]
    extra = large["rows"] - small["rows"]

    def margin(step: str) -> float:
        return extra / (large["seconds"][step] - small["seconds"][step])

    def per_row(run: dict) -> float:
        return run["seconds"]["transform"] / run["rows"]

    return {
        "margin_rows_per_s": {"raw": margin("raw"), "transform": margin("transform")},
        "margin_transform_over_raw": margin("transform") / margin("raw"),
        "transform_time_per_row_largest_over_smallest": per_row(large) / per_row(small),
        "driver_peak_rss_largest_over_smallest": large["driver_peak_rss_mb"]
        / small["driver_peak_rss_mb"],
        "driver_rss_growth_mb": {str(r["rows"]): r["driver_rss_growth_mb"] for r in runs},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs="+", default=[200_000, 800_000])
    parser.add_argument("--rows-per-file", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128, help="embedding and side-info width")
    parser.add_argument("--width", type=int, default=8, help="hidden width of h and g")
    parser.add_argument("--batch-size", type=int, default=16384)
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/transform_pipeline_cpu.json")
    args = parser.parse_args(argv)

    import ray

    results = {"machine": machine_info(), "args": dict(vars(args))}
    torch.set_num_threads(1)  # the driver coordinates; compute() measures one thread
    ray.init(num_cpus=args.processes, include_dashboard=False, logging_level="WARNING")
    results["load_average_at_start"] = os.getloadavg()
    start = time.perf_counter()
    results["runs"] = [bench_size(rows, args) for rows in sorted(args.size)]
    results["benchmark_seconds"] = time.perf_counter() - start
    results["load_average_at_end"] = os.getloadavg()
    if len(results["runs"]) >= 2:
        results["summary"] = summarise(results["runs"])
    emit(results, args.out)
    ray.shutdown()
    return results


if __name__ == "__main__":
    main()
