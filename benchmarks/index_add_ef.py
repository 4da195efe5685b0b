"""The sharded IVF's add phase with an HNSW quantizer, adding at efSearch 16 against 8, in the
real pipeline: what ``HNSW_EF_ADD`` changes per added row.

    .venv/bin/python benchmarks/index_add_ef.py --out benchmarks/results/index_add_ef_cpu.json

A cosine version of ``--rows`` x 32 (``index_scale.publish``: unit rows around 1000 centres)
in a temporary local store; for each efSearch, a build with ``nlist`` 16,384 lists (the size
``index_scale`` gets at 16M rows), an HNSW quantizer, ``--train-size`` sampled rows, shards of
``--shard-rows`` rows and ``RayTasks(workers=1)`` (one add task at a time: no contention
between tasks). The template is trained once per efSearch (Ray's workers set
``raycompat.index.ivf.HNSW_EF_ADD`` through a ``worker_process_setup_hook``; the build's
identity differs, so each has its own folder); then the add phase is timed ``--repeats``
times, each after removing the shards (the template is kept). Reported: add seconds and us per
row, per repeat and median.
"""

from __future__ import annotations

import argparse
import glob
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402
from index_scale import CENTRES, publish, unit  # noqa: E402

import raycompat.index.ivf as ivf  # noqa: E402
from raycompat.cluster.pipelines.index import RayTasks  # noqa: E402
from raycompat.index.version_index import build_version_index  # noqa: E402
from raycompat.store import GalleryStore  # noqa: E402


class Phases(logging.Handler):
    """Times of the build's log lines (the add phase runs from "to build" to "100.0%")."""

    def __init__(self):
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def emit(self, record):
        self.lines.append((time.perf_counter(), record.getMessage()))

    def add_seconds(self) -> float:
        start = next(t for t, m in self.lines if "to build" in m)
        return next(t for t, m in self.lines if "100.0%" in m) - start


def set_ef(ef: int) -> None:
    ivf.HNSW_EF_ADD = ef  # the graph and the build's identity both read it from there


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_200_000)
    parser.add_argument("--shard-rows", type=int, default=1_600_000)
    parser.add_argument("--train-size", type=int, default=400_000)
    parser.add_argument("--nlist", type=int, default=16384)
    parser.add_argument("--ef", type=int, nargs="+", default=[16, 8])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    phases = Phases()
    logging.getLogger("raycompat").addHandler(phases)
    logging.getLogger("raycompat").setLevel(logging.INFO)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        root = str(Path(tmp, "store"))
        publish(
            root, args.rows, 32, 200_000, unit(np.random.default_rng(0).normal(size=(CENTRES, 32)))
        )
        store = GalleryStore(root)
        for ef in args.ef:
            set_ef(ef)
            hook = lambda ef=ef: set_ef(ef)  # noqa: E731 - Ray pickles it to every worker
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"worker_process_setup_hook": hook},
            )
            seconds = []
            for _ in range(args.repeats):
                for shards in glob.glob(f"{root}/bench/_index/v1/*/_shards"):
                    shutil.rmtree(shards)
                phases.lines.clear()
                build_version_index(
                    store,
                    "bench",
                    "v1",
                    kind="sharded_ivf",
                    runner=RayTasks(workers=1),
                    nlist=args.nlist,
                    train_size=args.train_size,
                    rows_per_shard=args.shard_rows,
                    quantizer="hnsw",
                    use_gpu=False,
                )
                seconds.append(phases.add_seconds())
            ray.shutdown()
            runs.append(
                {
                    "ef_add": ef,
                    "add_s": seconds,
                    "add_us_per_row": [1e6 * s / args.rows for s in seconds],
                    "median_add_us_per_row": 1e6 * float(np.median(seconds)) / args.rows,
                }
            )
    by_ef = {r["ef_add"]: r["median_add_us_per_row"] for r in runs}
    result = {
        "benchmark": "index_add_ef",
        "machine": machine_info(),
        "rows": args.rows,
        "nlist": args.nlist,
        "shard_rows": args.shard_rows,
        "train_size": args.train_size,
        "workers": 1,
        "runs": runs,
        "ef8_over_ef16": by_ef[8] / by_ef[16] if {8, 16} <= by_ef.keys() else None,
    }
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
