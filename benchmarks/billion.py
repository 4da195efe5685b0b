"""A billion rows, measured rather than projected (issue 54): the upgrade path on one machine.

    nice -n 10 .venv/bin/python benchmarks/billion.py --rows 1000000000 \\
        --out benchmarks/results/billion_cpu.json
    nice -n 10 .venv/bin/python benchmarks/billion.py --rows 4000000 --part-rows 250000 \
        --index-rows 1000000 --out benchmarks/results/billion_4m_cpu.json

Rows are 8-d float16 unit vectors with int64 ids 0 .. N-1 (24 B of data a row, so what grows
with rows shows). The working folder is ``--root`` (default: a new folder under the current
directory, on its filesystem); everything written there is removed at the end unless
``--keep``. The steps, in order, each timed:

1. **disk**: free space (``shutil.disk_usage``) against about two versions of N rows; too
   little is one line and exit 2, before anything is written. The first part's measured bytes
   per row refine the estimate (the same refusal, then).
2. **generate**: v1's rows as a user's producer writes them: plain pyarrow Parquet parts of
   ``--part-rows`` rows, ``--writers`` processes, into a folder outside the store.
3. **adopt**: ``raycompat adopt`` publishes that folder as v1 in place (its files scanned on a
   private local Ray; ids proven unique from each file's range, so nothing on the driver grows
   with rows).
4. **fit**: a Procrustes map fitted on ``--pairs`` rows of v1 and a rotation of them
   (``fit_procrustes`` over ``PairStatistics``), saved with ``save_transformation``.
5. **transform**: ``python jobs/transform.py --config <yaml written here>`` as a user runs it,
   SIGKILLed with its whole process group once ``--kill-at-parts`` (default half) of v2's part
   files are in its staging area, then the same command again: parts kept and redone, both
   runs' wall time and rows/s between their first and last part files, the time lost, the
   commit (from the last part file to the job's "published" line), and the killed run's
   temporary files left in the staging area's ``_tmp/``. The job's peak RSS is its VmHWM,
   sampled every 50 ms while it runs (the last sample before it ends).
6. **verify** (this script's own checks, one part in memory at a time): v2's record holds N
   rows; per part the ids are strictly increasing and the parts' ranges tile 0 .. N-1 exactly
   (so the ids are unique), their sum is N (N - 1) / 2; on ``--check-parts`` parts the map
   recomputed in NumPy from v1's rows equals v2's rows within float16's rounding.
7. **operations**, each in a fresh process with its peak RSS (VmHWM): ``raycompat status``
   after the kill and at the end, ``versions``, ``history``, validate-on-read of v2
   (``GalleryStore.iter_batches``, then each file's sha256 against its record), ``promote`` m2
   to v2, ``retire`` m1, ``gc --keep-versions 1 --dry-run`` and ``gc``, ``export`` of v2 to
   Delta if the disk allows (else the reason), and with ``--index-rows M`` a ``sharded_ivf``
   ``raycompat index build`` on M rows of v2 (its own recall@10 against exact search).

Each step reports wall seconds, rows/s where it moves rows, the driver's peak RSS (MB), the
parts it touched, the files and bytes on disk after it, and ms per part where its cost should
grow with parts (commit, listings, validation, gc's plan, history). A tiny run (the test's) is
killed mid-way as a large one is: by the count of part files, with small ``--batch-rows`` and
one actor so that its parts take long enough to be counted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _billion import (  # noqa: E402
    CHUNKS_LINE,
    EXPORT_BYTES_PER_ROW,
    GALLERY,
    GUESS_BYTES_PER_ROW,
    WIDTH,
    Job,
    Work,
    ceil_div,
    free_bytes,
    hwm_mb,
    key_values,
    need_bytes,
    part_files,
    part_path,
    rate,
    refusal,
    run_cli,
    run_script,
    stderr_line,
    steady_rate,
    tree,
    watch,
    write_part,
)
from _billion_checks import VALIDATE, verify_v2  # noqa: E402
from _machine import emit, machine_info  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    cpus = os.cpu_count() or 1
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000_000)
    p.add_argument("--part-rows", type=int, default=4_000_000, help="rows per part file")
    p.add_argument("--root", type=Path, default=None, help="working folder (default: new, in .)")
    p.add_argument("--out", default=None, help="save the JSON here too")
    p.add_argument("--writers", type=int, default=cpus, help="producer processes")
    p.add_argument("--actors", type=int, default=cpus, help="the transform job's run.actors")
    p.add_argument("--batch-rows", type=int, default=65536, help="the job's run.batch_size")
    p.add_argument("--kill-at-parts", type=int, default=None, help="default: half the parts")
    p.add_argument("--pairs", type=int, default=100_000, help="rows the map is fitted on")
    p.add_argument("--check-parts", type=int, default=3, help="parts whose rows are recomputed")
    p.add_argument("--index-rows", type=int, default=0, help="index M rows of v2 (0: skip)")
    p.add_argument("--index-queries", type=int, default=1000)
    p.add_argument("--no-export", action="store_true", help="skip the Delta export")
    p.add_argument("--progress-s", type=float, default=10.0, help="seconds between progress")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    args = p.parse_args(argv)
    if args.rows < 1 or args.part_rows < 1:
        p.error("--rows and --part-rows must be >= 1")
    parts = ceil_div(args.rows, args.part_rows)
    if parts < 2 or not 0 < (args.kill_at_parts or 1) < parts:
        p.error(f"{parts} part(s): the job is killed after some parts and before the last")
    return args


def on_disk(work: Work, step: dict, rows: int | None = None, parts: int | None = None) -> dict:
    """``step`` with the rows/s, ms per part and what is on disk now."""
    files, size = tree(work.root)
    seconds = step.get("seconds", step["wall_s"])
    if rows is not None:
        step["rows_per_s"] = rate(rows, step["wall_s"])
    if parts:
        step["parts"], step["ms_per_part"] = parts, 1000 * seconds / parts
    step.update(files_on_disk=files, bytes_on_disk=size)
    return step


def check_disk(args: argparse.Namespace, work: Work) -> dict:
    """Refuse (one line, exit 2) unless about two versions of the rows fit."""
    free = free_bytes(work.root)
    need = need_bytes(args.rows, GUESS_BYTES_PER_ROW)
    if need > free:
        basis = f"2 versions x {GUESS_BYTES_PER_ROW} B/row, estimated"
        print(refusal(args.rows, need, free, work.root, basis), file=sys.stderr)
        raise SystemExit(2)
    return {"free_bytes": free, "need_bytes_estimated": need}


def generate(args: argparse.Namespace, work: Work, disk: dict) -> dict:
    """v1's part files, the first alone (its bytes per row refine the disk check)."""
    work.table.mkdir(parents=True)
    starts = range(0, args.rows, args.part_rows)
    tasks = [
        (part_path(work.table, k), s, min(args.part_rows, args.rows - s), k)
        for k, s in enumerate(starts)
    ]
    start = time.perf_counter()
    first = write_part(tasks[0])
    per_row = first / tasks[0][2]
    in_flight = int(args.actors * args.part_rows * per_row)  # temporary files of the killed run
    disk["bytes_per_row_measured"] = per_row
    disk["need_bytes_measured"] = need_bytes(args.rows, per_row, extra=in_flight)
    if disk["need_bytes_measured"] > free_bytes(work.root) + first:
        line = refusal(
            args.rows,
            disk["need_bytes_measured"],
            disk["free_bytes"],
            work.root,
            f"2 versions x {per_row:.1f} B/row, measured on the first part",
        )
        print(line, file=sys.stderr)
        raise SystemExit(2)
    written, last = [first], time.perf_counter()
    with ProcessPoolExecutor(max(1, min(args.writers, len(tasks) - 1))) as pool:
        for size in pool.map(write_part, tasks[1:]):
            written.append(size)
            if time.perf_counter() - last >= args.progress_s:
                last = time.perf_counter()
                stderr_line(f"generate: {len(written)} of {len(tasks)} parts")
    step = {"wall_s": time.perf_counter() - start, "writers": args.writers, "files": len(tasks)}
    step["bytes"], step["driver_peak_rss_mb"] = sum(written), hwm_mb(os.getpid())
    return on_disk(work, step, args.rows, len(tasks))


def adopt(args: argparse.Namespace, work: Work, parts: int) -> dict:
    argv = [
        "adopt",
        GALLERY,
        str(work.table),
        "--store",
        str(work.store),
        "--version",
        "v1",
        "--model",
        "m1",
        "--normalized",
        "yes",
        "--json",
    ]
    step = run_cli(work, "adopt", argv, args.progress_s)
    step["output"] = {k: step["output"][k] for k in ("rows", "files", "dtype", "normalized")}
    return on_disk(work, step, args.rows, parts)


def fit(args: argparse.Namespace, work: Work) -> dict:
    """A Procrustes map from v1's first rows to a rotation of them (plus a little noise)."""
    from raycompat.store.read.vectors import float32_rows
    from raycompat.transformations import PairStatistics, fit_procrustes, save_transformation

    start = time.perf_counter()
    first = pq.ParquetFile(part_path(work.table, 0))
    batch = next(first.iter_batches(batch_size=min(args.pairs, args.part_rows, args.rows)))
    x = float32_rows(batch.column("embedding"))
    rng = np.random.default_rng(54)
    rotation, _ = np.linalg.qr(rng.standard_normal((WIDTH, WIDTH)))
    y = x @ rotation + 0.01 * rng.standard_normal(x.shape)
    y = (y / np.linalg.norm(y, axis=1, keepdims=True)).astype(np.float32)
    result = fit_procrustes(PairStatistics.of(x, y, gram=False, sums=False), normalize_output=True)
    save_transformation(work.h, result.transformation, **result.info())
    seconds = time.perf_counter() - start
    return {"wall_s": seconds, "pairs": result.pairs, "relative_residual": result.relative_residual}


def write_config(args: argparse.Namespace, work: Work) -> Path:
    """The transform job's YAML, as a user would write it for this store."""
    config = {
        "mode": "transform",
        "store": {"root": str(work.store), "gallery": GALLERY},
        "source_version": "v1",
        "transformation": str(work.h),
        "target": {
            "version": "v2",
            "model_version": "m2",
            "width": WIDTH,
            "normalized": True,
            "dtype": "float16",
        },
        "run": {
            "rows_per_file": args.part_rows,
            "batch_size": args.batch_rows,
            "actors": args.actors,
            "threads_per_actor": 1,
            "progress_every_s": args.progress_s,
        },
    }
    path = work.root / "transform_billion.yaml"
    head = f"# Run: python jobs/transform.py --config {path}\n"
    path.write_text(head + yaml.safe_dump(config, sort_keys=False))
    return path


def first_run(args: argparse.Namespace, work: Work, config: Path, parts: int) -> dict:
    """The job until ``--kill-at-parts`` part files are written, then SIGKILL."""
    stop_at = args.kill_at_parts or max(1, parts // 2)
    job = Job(config, work.logs / "transform_1.log")
    seen = watch(job, work.staging, stop_at, "transform (first run)", args.progress_s)
    code, seconds = job.wait()
    if not job.killed_pids:
        raise RuntimeError(f"the first run exited {code} before {stop_at} parts; see {job.log}")
    times = sorted(seen.values())
    return {
        "wall_s": seconds,
        "rc": code,
        "killed": True,
        "killed_processes": job.killed_pids,
        "kill_at_parts": stop_at,
        "parts_at_kill": len(seen),
        "parts_after_kill": len(part_files(work.staging)),  # none may appear once it is dead
        "first_part_s": times[0] if times else None,
        "last_part_s": times[-1] if times else None,
        "steady_rows_per_s": steady_rate(times, args.part_rows),
        "driver_peak_rss_mb": job.peak_rss_mb,
        "files": sorted(seen),
    }


def second_run(args: argparse.Namespace, work: Work, config: Path) -> dict:
    """The same command again: it resumes, writes what is missing and publishes."""
    before = set(os.listdir(work.staging))
    job = Job(config, work.logs / "transform_2.log")
    seen = watch(job, work.staging, None, "transform (rerun)", args.progress_s)
    code, seconds = job.wait()
    if code != 0:
        raise RuntimeError(f"the rerun exited {code}; see {job.log}")
    new = sorted(t for name, t in seen.items() if name not in before)
    published = job.first(r"published .*\((\d+) rows, (\d+) files\)")
    chunks = job.first(CHUNKS_LINE)
    summary = job.first(r"summary: (.*)$")
    last = new[-1] if new else None
    return {
        "wall_s": seconds,
        "rc": code,
        "chunks_done_at_start": int(chunks[1][1]) if chunks else None,
        "chunks_planned": int(chunks[1][2]) if chunks else None,
        "first_new_part_s": new[0] if new else None,
        "last_part_s": last,
        "published_s": published[0] if published else None,
        "commit_s": published[0] - last if published and last is not None else None,
        "steady_rows_per_s": steady_rate(new, args.part_rows),
        "job_summary": key_values(summary[1][1]) if summary else None,
        "driver_peak_rss_mb": job.peak_rss_mb,
    }


def transform(args: argparse.Namespace, work: Work, parts: int) -> dict:
    """The job killed half-way, ``raycompat status`` of the staging area, the job again."""
    from raycompat.store import GalleryStore

    config = write_config(args, work)
    first = first_run(args, work, config, parts)
    status = on_disk(work, run_cli(work, "status_after_kill", status_argv(work)), None, parts)
    second = second_run(args, work, config)
    files = GalleryStore(str(work.store)).version(GALLERY, "v2").files
    kept = len({f.rsplit("/", 1)[-1] for f in files} & set(first.pop("files")))
    lost = None
    if first["last_part_s"] is not None and second["first_new_part_s"] is not None:
        # what an uninterrupted run would not have spent: the first run's work in flight at
        # the kill, and the rerun's start (Ray, planning, resuming) before its first new part
        lost = first["wall_s"] - first["last_part_s"] + second["first_new_part_s"]
    step = {
        "wall_s": first["wall_s"] + second["wall_s"],
        "parts_total": len(files),
        "parts_kept": kept,
        "parts_redone": len(files) - kept,
        "time_lost_s": lost,
        "first_run": first,
        "second_run": second,
        "status_after_kill": status,
        "driver_peak_rss_mb": max(x["driver_peak_rss_mb"] or 0 for x in (first, second)),
    }
    if second["commit_s"] is not None:
        step["commit_ms_per_part"] = 1000 * second["commit_s"] / len(files)
    # the killed run's partial parts: left in _tmp/ for gc (nothing removes them before)
    step["tmp_files_left"], step["tmp_bytes_left"] = tree(work.staging / "_tmp")
    return on_disk(work, step, args.rows, len(files))


def status_argv(work: Work) -> list[str]:
    return ["status", GALLERY, "--store", str(work.store), "--json"]


def listings(args: argparse.Namespace, work: Work, parts: int) -> dict:
    """``versions``, ``history`` and ``status`` of the published store (their ms per part
    count v1's and v2's parts), then validate-on-read of v2."""
    store, out = ["--store", str(work.store), "--json"], {}
    for name, argv in (
        ("versions", ["versions", GALLERY, *store]),
        ("history", ["history", GALLERY, *store]),
        ("status", status_argv(work)),
    ):
        step = run_cli(work, name, argv)
        step["output"] = summarize_output(name, step["output"])
        out[name] = on_disk(work, step, None, 2 * parts)
    every = str(args.progress_s)
    step = run_script(work, "validate", VALIDATE, str(work.store), GALLERY, "v2", every)
    out["validate_on_read"] = on_disk(work, step, args.rows, parts)
    return out


def summarize_output(name: str, output) -> object:
    """What the report keeps of a command's JSON (not the per-file lists)."""
    if not isinstance(output, dict):
        return output
    if name == "versions":
        return [{k: v[k] for k in ("version", "rows", "dtype")} for v in output["versions"]]
    if name == "history":
        return {"versions": len(output.get("versions", [])), "keys": sorted(output)}
    if name.startswith("gc"):
        keep = ["kind", "what", "reason"]
        return {
            "items": [{k: i[k] for k in ("kind", "reason", "bytes")} for i in output["items"]],
            "kept": [{k: i[k] for k in keep} for i in output["kept"]],
            "bytes": output["bytes"],
            "bytes_freed": output["bytes_freed"],
        }
    return {k: v for k, v in output.items() if not isinstance(v, list) or len(v) < 20}


def lifecycle(args: argparse.Namespace, work: Work, parts: int) -> dict:
    """m2 serves v2, m1 is retired (v1 superseded); then gc's plan and gc itself."""
    store, out = ["--store", str(work.store)], {}
    out["promote"] = run_cli(
        work, "promote", ["promote", GALLERY, "--model", "m2", "--version", "v2", *store]
    )
    reason = "superseded: m2 serves v2 = h(v1)"
    out["retire"] = run_cli(work, "retire", ["retire", "m1", *store, "--reason", reason])
    for name, extra in (("gc_dry_run", ["--dry-run"]), ("gc", [])):
        step = run_cli(work, name, ["gc", *store, "--keep-versions", "1", *extra, "--json"])
        step["output"] = summarize_output(name, step["output"])
        out[name] = on_disk(work, step, None, parts)
    return out


def export(args: argparse.Namespace, work: Work) -> dict:
    """v2 as a Delta table, when the disk holds its float32 copy."""
    need, free = need_bytes(args.rows, EXPORT_BYTES_PER_ROW, copies=1), free_bytes(work.root)
    if args.no_export or need > free:
        why = "--no-export" if args.no_export else f"needs {need:,} B, {free:,} B free"
        return {"skipped": why}
    argv = [
        "export",
        GALLERY,
        str(work.delta),
        "--store",
        str(work.store),
        "--version",
        "v2",
        "--format",
        "delta",
        "--json",
    ]
    step = run_cli(work, "export_delta", argv, args.progress_s)
    step["delta_files"], step["delta_bytes"] = tree(work.delta)
    return on_disk(work, step, args.rows)


def index(args: argparse.Namespace, work: Work) -> dict:
    """M rows of v2 (its first parts, hard-linked into a folder and adopted as a gallery of
    their own), indexed by ``raycompat index build`` with its recall@10 against exact search."""
    from raycompat.store import GalleryStore

    store = GalleryStore(str(work.store))
    info = store.version(GALLERY, "v2")
    take = ceil_div(args.index_rows, args.part_rows)
    work.index_table.mkdir()
    for k, (path, _) in enumerate(list(store.version_files(GALLERY, info))[:take]):
        os.link(path, work.index_table / f"part-{k:05d}.parquet")
    root = ["--store", str(work.store)]
    adopted = run_cli(
        work,
        "index_adopt",
        [
            "adopt",
            "sample",
            str(work.index_table),
            *root,
            "--version",
            "v2s",
            "--model",
            "m2s",
            "--json",
        ],
        args.progress_s,
    )
    rows = adopted["output"]["rows"]
    argv = [
        "index",
        "build",
        "sample",
        "--version",
        "v2s",
        *root,
        "--kind",
        "sharded_ivf",
        "--queries",
        str(args.index_queries),
        "--workers",
        str(args.actors),
        "--json",
    ]
    step = run_cli(work, "index_build", argv, args.progress_s)
    step.update(index_rows=rows, adopt_wall_s=adopted["wall_s"])
    step["recall_at_10"] = step["output"]["recall"]
    return on_disk(work, step, rows, take)


def working_folder(args: argparse.Namespace) -> tuple[Work, bool]:
    """``(work, whether this run creates its root)``; a given root must be new or empty."""
    if args.root is None:
        return Work(Path.cwd() / f"billion-{uuid.uuid4().hex[:8]}"), True
    root = args.root.resolve()
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"billion.py: --root {root} is not empty; give a new or empty folder")
    return Work(root), not root.exists()


def clean(work: Work, created: bool) -> dict:
    files, size = tree(work.root)
    for child in list(work.root.iterdir()) if work.root.exists() else []:
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    if created and work.root.exists():
        work.root.rmdir()
    return {"removed_files": files, "removed_bytes": size}


def run(args: argparse.Namespace, work: Work, disk: dict, steps: dict, saved) -> None:
    """Each step into ``steps``, ``saved()`` after each (a long run that fails late keeps
    what it measured)."""
    parts = ceil_div(args.rows, args.part_rows)
    steps["generate"] = generate(args, work, disk)
    stderr_line(f"generated {parts} parts in {steps['generate']['wall_s']:.1f} s")
    saved()
    steps["adopt"] = adopt(args, work, parts)
    saved()
    steps["fit"] = fit(args, work)
    steps["transform"] = transform(args, work, parts)
    stderr_line(f"transform done: {steps['transform']['parts_kept']} parts kept")
    saved()
    steps["verify"] = verify_v2(work, args.rows, args.check_parts)
    saved()
    steps.update(listings(args, work, parts))
    steps.update(lifecycle(args, work, 2 * parts))
    saved()
    steps["export_delta"] = export(args, work)
    saved()
    if args.index_rows:
        steps["index"] = index(args, work)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    work, created = working_folder(args)
    disk = check_disk(args, work)
    work.root.mkdir(parents=True, exist_ok=True)
    steps: dict = {}
    result = {
        "benchmark": "billion",
        "machine": machine_info(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": args.rows,
        "parts": ceil_div(args.rows, args.part_rows),
        "width": WIDTH,
        "dtype": "float16",
        "disk": disk,
        "steps": steps,
        "complete": False,  # until every step has run: a partial file says how far it got
    }

    def saved() -> None:
        if args.out is not None:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")

    try:
        run(args, work, disk, steps, saved)
    finally:
        result["cleanup"] = {"kept": str(work.root)} if args.keep else clean(work, created)
        saved()
    result.update(complete=True, verified=steps["verify"]["passed"])
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
