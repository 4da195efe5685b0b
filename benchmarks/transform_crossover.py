"""Where the transform job overtakes a plain single-process loop (issue 53, item 6).

    nice -n 5 .venv/bin/python benchmarks/transform_crossover.py \
        --rows 250000 1000000 4000000 --out benchmarks/results/transform_crossover_cpu.json

For each N: N rows of ``--dim`` float32 embeddings with int64 ids in files of
``--rows-per-file`` rows, and a Procrustes h (a seeded random orthogonal map, saved as the job
reads it). Then ``--pairs`` rounds, the order of the variants rotating, of:

- ``loop``: what a user writes instead, run as a fresh ``python -c`` process:
  ``pq.ParquetFile.iter_batches`` -> ``torch.addmm(b, x, W)`` -> ``pq.ParquetWriter`` (its
  defaults), torch's default threads, one file after another;
- ``job``: ``raycompat-transform --config cfg.yaml`` as a user runs it (a fresh process: it
  checks its inputs, starts a private local Ray, transforms with ``--actors`` actors, commits
  and publishes). Its stages are timed from its log lines as they arrive: to the ``outputs:``
  line (interpreter, imports, config, input checks), to the ``Ray:`` line (``ray.init``), to the
  ``summary:`` line (``transform_version``: planning, actor start-up, the rows, commit and
  publish; the grant), to the exit (Ray's shutdown). The CPU of its process tree is split
  into the job's process, the map actors and Ray's other processes (psutil, sampled every
  0.25 s: a process that ends between two samples loses at most that much);
- ``job_before`` (with ``--before DIR``, at the sizes of ``--before-rows``): the same job from
  another checkout (``PYTHONPATH=DIR``, e.g. ``git archive HEAD | tar -x -C DIR``), so that a
  change of the fixed cost is measured in the same rounds.

Reported per N: the medians of the wall seconds, CPU seconds and rows/s, and job / loop. Over
the sizes, each variant's ``t = fixed + N / rate`` and its CPU's ``fixed + N x us/row`` (least
squares on the medians) and the crossover
``N* = (fixed_job - fixed_loop) / (1 / rate_loop - 1 / rate_job)``, the size from which the job's
rows/s exceed the loop's (none when the job's marginal rate is not the higher).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402
from _transform_cpu import TreeCPU  # noqa: E402
from transform_throughput import make_source  # noqa: E402

from raycompat.transformations import ProcrustesTransformation, save_transformation  # noqa: E402

JOB = str(Path(sys.executable).with_name("raycompat-transform"))  # pip install -e .
GALLERY = "bench"  # make_source's gallery, version v1
# The job's log lines that end each stage, in order (its own INFO lines, on stderr).
STAGES = (("checks", " outputs: "), ("ray_init", " Ray: "), ("transform", " summary: "))

LOOP = """
import sys, warnings
import numpy as np, pyarrow as pa, pyarrow.parquet as pq, torch
warnings.filterwarnings("ignore", "The given NumPy array is not writable")  # only read
weight, out, batch_size, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
w = torch.from_numpy(np.load(weight))
b = torch.zeros(w.shape[1])
for path in files:
    writer = None
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
        x = batch.column("embedding").flatten().to_numpy().reshape(len(batch), -1)
        y = torch.addmm(b, torch.from_numpy(x), w).numpy()
        table = pa.table({
            "id": batch.column("id"),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(y.reshape(-1)), y.shape[1]),
        })
        if writer is None:
            writer = pq.ParquetWriter(out + "/" + path.rsplit("/", 1)[1], table.schema)
        writer.write_table(table)
    writer.close()
"""


def prepare(tmp: str, rows: int, args) -> list[str]:
    """The source version and h in ``tmp``; the input files' paths."""
    store = make_source(f"{tmp}/store", rows, args.rows_per_file, args.dim, side_info=False)
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((args.dim, args.dim)))
    h = ProcrustesTransformation(args.dim, args.dim)
    h.set_weights(q, np.zeros(args.dim))
    save_transformation(f"{tmp}/h", h, "h")
    np.save(f"{tmp}/w.npy", q.astype(np.float32))
    return [store.path(GALLERY, f) for f in store.version(GALLERY, "v1").files]


def run_loop(tmp: str, files: list[str], args) -> dict:
    """One loop run: wall seconds and its process's CPU (user + sys)."""
    out = f"{tmp}/loop"
    os.makedirs(out)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    argv = [sys.executable, "-c", LOOP, f"{tmp}/w.npy", out, str(args.batch_size), *files]
    subprocess.run(argv, check=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(out)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"seconds": seconds, "cpu_s": cpu}


def run_job(tmp: str, version: str, args, pythonpath: str | None = None) -> dict:
    """One job run: wall seconds, the seconds of each stage, its summary, CPU by process."""
    config = {
        "mode": "transform",
        "store": {"root": f"{tmp}/store", "gallery": GALLERY},
        "source_version": "v1",
        "transformation": f"{tmp}/h",
        "target": {"version": version, "model_version": f"m-{version}", "width": args.dim},
        "run": {"rows_per_file": args.rows_per_file, "batch_size": args.batch_size,
                "actors": args.actors},
    }  # fmt: skip
    Path(f"{tmp}/{version}.yaml").write_text(json.dumps(config))  # JSON is YAML
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    marks, summary = {}, None
    start = time.perf_counter()
    with TreeCPU(driver="raycompat-transform") as tree:
        job = subprocess.Popen(
            [JOB, "--config", f"{tmp}/{version}.yaml"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for line in job.stderr:
            for stage, mark in STAGES:
                if mark in line and stage not in marks:
                    marks[stage] = time.perf_counter() - start
            if " summary: " in line:  # "summary: mode=transform ... seconds=34.49 ..."
                summary = dict(re.findall(r"(\w+)=(\S+)", line.split(" summary: ", 1)[1]))
        code = job.wait()
    seconds = time.perf_counter() - start
    if code != 0 or len(marks) != len(STAGES):
        raise RuntimeError(f"the job exited {code}; stages seen: {marks}")
    ends = [marks[stage] for stage, _ in STAGES] + [seconds]
    names = [stage for stage, _ in STAGES] + ["shutdown"]
    stages = dict(zip(names, np.diff([0.0, *ends]).tolist(), strict=True))
    return {
        "seconds": seconds,
        "stages_s": stages,
        "transform_version_s": float(summary["seconds"]),
        "actor_chunk_cpu_s": float(summary["actor_cpu_s"]),
        "cpu_s": tree.total,
        "cpu_s_by_process": tree.by_kind,
    }


def bench_size(rows: int, args) -> dict:
    tmp = tempfile.mkdtemp(prefix="transform_crossover_", dir=os.environ.get("BENCH_TMP"))
    try:
        files = prepare(tmp, rows, args)
        variants = {
            "loop": lambda k: run_loop(tmp, files, args),
            "job": lambda k: run_job(tmp, f"v{k}a", args),
        }
        if args.before and rows in args.before_rows:
            variants["job_before"] = lambda k: run_job(tmp, f"v{k}b", args, args.before)
        names, runs = list(variants), {name: [] for name in variants}
        for k in range(args.pairs):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                runs[name].append({"load_1min": os.getloadavg()[0], **variants[name](k)})
                print(json.dumps({"rows": rows, name: runs[name][-1]}), flush=True)
        medians = {name: statistics.median(r["seconds"] for r in runs[name]) for name in names}
        cpu = {name: statistics.median(r["cpu_s"] for r in runs[name]) for name in names}
        return {
            "rows": rows,
            "files": len(files),
            "median_s": medians,
            "median_cpu_s": cpu,
            "rows_per_s": {name: rows / s for name, s in medians.items()},
            "job_over_loop_rows_per_s": medians["loop"] / medians["job"],
            "job_stages_median_s": {
                stage: statistics.median(r["stages_s"][stage] for r in runs["job"])
                for stage in runs["job"][0]["stages_s"]
            },
            "runs": runs,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fixed_and_rate(sizes: list[int], seconds: list[float]) -> dict:
    """``t = fixed + N / rate`` by least squares over the sizes."""
    slope, fixed = np.polyfit(np.asarray(sizes, float), np.asarray(seconds, float), 1)
    return {"fixed_s": float(fixed), "rows_per_s_at_margin": float(1 / slope)}


def crossover(entries: list[dict]) -> dict:
    """The fits of wall time and of CPU, and the size from which the job's rows/s are the
    loop's or more (None: its marginal rate is not the higher, so never)."""
    sizes = [e["rows"] for e in entries]
    fits = {v: fixed_and_rate(sizes, [e["median_s"][v] for e in entries]) for v in ("loop", "job")}
    cpu = {v: fixed_and_rate(sizes, [e["median_cpu_s"][v] for e in entries]) for v in fits}
    job, loop = fits["job"], fits["loop"]
    gain = 1 / loop["rows_per_s_at_margin"] - 1 / job["rows_per_s_at_margin"]
    rows = (job["fixed_s"] - loop["fixed_s"]) / gain if gain > 0 else None
    cpu_us = {v: 1e6 / fit["rows_per_s_at_margin"] for v, fit in cpu.items()}
    return {
        "fits": fits,
        "crossover_rows": rows,
        "cpu_fits": {
            v: {"fixed_cpu_s": cpu[v]["fixed_s"], "cpu_us_per_row": cpu_us[v]} for v in cpu
        },
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[250_000, 1_000_000, 4_000_000])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--rows-per-file", type=int, default=250_000)
    parser.add_argument("--batch-size", type=int, default=65536)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=1, help="rounds of the variants per size")
    parser.add_argument("--before", default=None, help="a checkout to run job_before from")
    parser.add_argument("--before-rows", type=int, nargs="*", default=[250_000])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = {"benchmark": "transform_crossover", "machine": machine_info(), "args": vars(args)}
    result["load_start"] = os.getloadavg()
    result["sizes"] = [bench_size(rows, args) for rows in args.rows]
    if len(args.rows) >= 2:
        result |= crossover(result["sizes"])
    result["load_end"] = os.getloadavg()
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
