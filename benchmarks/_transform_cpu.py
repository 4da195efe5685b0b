"""CPU per row of the FCT transform against the plain loop (issue 24, item 4).

``transform_throughput.py --pairs K`` runs this: K interleaved rounds of
- ``loop_1t``: ``iter_batches`` -> torch h -> ``ParquetWriter`` in this process, 1 torch thread
  (its CPU per row is the reference: no OpenMP spinning);
- ``loop_2t``: the same with 2 torch threads (its rows/s is the reference: the CPUs Ray gets);
- ``loop_tuned``: 1 thread, no dictionary on the vector columns (as the store's writer);
- ``transform``: ``transform_version`` with ``actors`` x 1 thread, ``ray.init`` done before.
CPU is user + sys seconds: ``time.process_time`` for the loops; for the transform the whole
process tree (driver, raylet, GCS, Ray Data's actors, the map actors), sampled every 0.25 s with
psutil, split into the actors' start-up (process start, imports, model) and the rest
(``run_staged``'s ``actor_cpu_s`` is the actors' CPU on the chunks themselves).
:func:`overheads` times each check and conversion of the pipeline on one batch, in process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import threading
import time

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from raycompat.cluster.pipelines import apply_transformation, transform_version
from raycompat.store import VersionInfo, validate_table
from raycompat.store.commit.part_record import IdFingerprint, IdStats
from raycompat.store.schema import validate_values


class TreeCPU:
    """User + sys CPU seconds of this process and its descendants while the block runs, per
    process kind (``driver``, ``actors`` = the map actors, ``ray`` = every other process).
    The sampler's own CPU (reading /proc of every process) is taken off the driver's.
    ``driver``: a word of the command line (program and first argument) of a child to count as
    the ``driver`` instead of this process (a job run as a subprocess; this one then only waits,
    and counts as ``ray`` with the sampler's CPU)."""

    def __init__(self, driver: str | None = None):
        self._driver = driver

    def __enter__(self):
        self._start, self._last, self._kind, self._own = {}, {}, {}, 0.0
        self._stop = threading.Event()
        self._sample(self._start)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _sample(self, into: dict) -> None:
        me = psutil.Process()
        for p in [me, *me.children(recursive=True)]:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    command = p.cmdline()[:2]
            except psutil.Error:
                continue
            into[p.pid] = max(into.get(p.pid, 0.0), t.user + t.system)
            if self._driver is None:
                driver = p.pid == me.pid
            else:
                driver = self._driver in " ".join(command)
            name = " ".join(command[:1])
            self._kind[p.pid] = "driver" if driver else "actors" if "MapWorker" in name else "ray"

    def _loop(self) -> None:
        start = time.thread_time()
        while not self._stop.wait(0.25):
            self._sample(self._last)
        self._own = time.thread_time() - start

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample(self._last)
        self.by_kind = dict.fromkeys(("driver", "actors", "ray"), 0.0)
        for pid, cpu in self._last.items():
            self.by_kind[self._kind[pid]] += cpu - self._start.get(pid, 0.0)
        self.by_kind["driver" if self._driver is None else "ray"] -= self._own
        self.total = sum(self.by_kind.values())


def loop(files: list[str], out_dir: str, batch_size: int, h, threads: int, **options) -> dict:
    """The plain loop a user would write (``ParquetWriter`` defaults, or ``options``)."""
    torch.set_num_threads(threads)
    os.makedirs(out_dir, exist_ok=True)
    start, cpu = time.perf_counter(), time.process_time()
    for path in files:
        parquet, writer = pq.ParquetFile(path), None
        for batch in parquet.iter_batches(batch_size=batch_size):
            table = apply_transformation(batch, h)
            if writer is None:
                name = f"{out_dir}/{os.path.basename(path)}"
                writer = pq.ParquetWriter(name, table.schema, **options)
            writer.write(table)
        writer.close()
    result = {"seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}
    shutil.rmtree(out_dir)
    torch.set_num_threads(1)
    return result


def transform(store, source: str, target: VersionInfo, fct: str, run) -> dict:
    start = time.perf_counter()
    with TreeCPU() as tree:
        summary = transform_version(store, "bench", source, target, fct, run=run)
    seconds = time.perf_counter() - start
    startup = tree.by_kind["actors"] - summary["actor_cpu_s"]
    return {
        "seconds": seconds,
        "cpu_s": tree.total,
        "cpu_s_by_process": tree.by_kind,
        "actor_chunk_cpu_s": summary["actor_cpu_s"],
        "actor_startup_cpu_s": startup,
        "cpu_s_without_actor_startup": tree.total - startup,
    }


def pairs(store, files: list[str], fct: str, h, args, rows: int) -> dict:
    """``args.pairs`` interleaved rounds (the loops, then the transform); medians and ratios."""
    from raycompat.cluster.pipelines import RunOptions

    run = RunOptions(
        rows_per_file=args.rows_per_file,
        batch_size=args.batch_size,
        actors=args.actors,
        threads_per_actor=1,
        progress_every_s=60,
    )
    rounds = []
    for k in range(args.pairs):
        load = os.getloadavg()[0]
        one = loop(files, f"{args.tmp}/loop1", args.batch_size, h, 1)
        two = loop(files, f"{args.tmp}/loop2", args.batch_size, h, args.actors)
        tuned = loop(files, f"{args.tmp}/tuned", args.batch_size, h, 1, use_dictionary=["id"])
        target = VersionInfo(f"t{k}", "m2", args.dim, False, "t = h(v1)")
        ray_run = transform(store, "v1", target, fct, run)
        rounds.append(
            {
                "load_1min": load,
                "loop_1t": one,
                "loop_2t": two,
                "loop_tuned": tuned,
                "transform": ray_run,
            }
        )
        print(rounds[-1], flush=True)
    return {"rounds": rounds, **summarise(rounds, rows)}


def summarise(rounds: list[dict], rows: int) -> dict:
    """Medians over the rounds: CPU us/row, the transform's CPU outside its chunks (seconds),
    rows/s, and the ratios the issue asks for."""

    def med(step: str, key: str) -> float:
        return statistics.median(r[step][key] for r in rounds)

    def med_kind(kind: str) -> float:
        return statistics.median(r["transform"]["cpu_s_by_process"][kind] for r in rounds)

    us = 1e6 / rows
    loop_us = med("loop_1t", "cpu_s") * us
    chunks_us = med("transform", "actor_chunk_cpu_s") * us
    all_us = med("transform", "cpu_s") * us
    outside = {
        "actor_startup": med("transform", "actor_startup_cpu_s"),
        "driver": med_kind("driver"),
        "other_ray_processes": med_kind("ray"),
    }
    loop_rate = rows / med("loop_2t", "seconds")
    ray_rate = rows / med("transform", "seconds")
    return {
        "cpu_us_per_row": {
            "loop_1_thread": loop_us,
            "loop_2_threads": med("loop_2t", "cpu_s") * us,
            "loop_tuned_1_thread": med("loop_tuned", "cpu_s") * us,
            "transform_actor_chunks": chunks_us,
            "transform_end_to_end": all_us,
        },
        "transform_cpu_s_outside_chunks": outside,
        "rows_per_s": {"loop_2_threads": loop_rate, "transform": ray_rate},
        "ratios": {
            "cpu_per_row_actor_chunks_over_loop": chunks_us / loop_us,
            "cpu_per_row_actor_chunks_over_tuned_loop": chunks_us
            / (med("loop_tuned", "cpu_s") * us),
            "cpu_per_row_end_to_end_over_loop": all_us / loop_us,
            "rows_per_s_transform_over_loop": ray_rate / loop_rate,
        },
    }


def _per_row(fn, rows: int, repeat: int = 20) -> float:
    """Median CPU microseconds per row of ``fn()`` over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        cpu = time.process_time()
        fn()
        times.append(time.process_time() - cpu)
    return statistics.median(times) * 1e6 / rows


def overheads(path: str, info: VersionInfo, h, batch_size: int) -> dict:
    """CPU us/row of each step of one batch through the pipeline (1 torch thread), next to the
    plain loop's read, forward and write: what every check and conversion costs."""
    torch.set_num_threads(1)
    parquet = pq.ParquetFile(path, page_checksum_verification=True)
    batch = next(parquet.iter_batches(batch_size=batch_size))
    n, out = batch.num_rows, apply_transformation(batch, h)

    def read(verify: bool):
        file = pq.ParquetFile(path, page_checksum_verification=verify)
        return lambda: next(file.iter_batches(batch_size=batch_size))

    def write(**options):
        return lambda: _write(out, options)

    encoded = _write(out, {"write_page_checksum": True, "use_dictionary": ["id"]})
    steps = {
        "read (plain loop)": read(False),
        "read: page CRC verification": read(True),
        "input checks (validate_values)": lambda: validate_values(batch, info, "in"),
        "input id fingerprint": lambda: IdFingerprint.of(batch.column("id")),
        "h forward (plain loop)": lambda: apply_transformation(batch, h),
        "output select + cast": lambda: out.select(out.column_names).cast(out.schema),
        "output checks (validate_table)": lambda: validate_table(out, info, "out"),
        "output id fingerprint + min/max": lambda: IdStats().update(out.column("id")),
        "write (plain loop: dictionary on)": write(),
        "write (no dictionary on vectors)": write(use_dictionary=["id"]),
        "write (store: page CRCs, no dictionary on vectors)": write(
            write_page_checksum=True, use_dictionary=["id"]
        ),
        "sha256 of the written bytes": lambda: hashlib.sha256(encoded).digest(),
    }
    return {name: _per_row(fn, n) for name, fn in steps.items()}


def _write(table: pa.Table, options: dict) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, **options) as writer:
        writer.write_table(table)
    return sink.getvalue()
