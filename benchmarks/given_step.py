"""A step that trains nothing (a given old model): one Ray task vs a Ray Train run.

    .venv/bin/python benchmarks/given_step.py --out benchmarks/results/given_step_cpu.json

Every upgrade after the first, and every ``two_model`` scenario with ``scenario.old_model``,
starts with such a step: load the given model, extract validation and test features, write the
checkpoint. ``run_training`` evaluates it with one task (:mod:`raycompat.cluster.train.evaluate`);
before, it was a Ray Train run of 0 epochs. Both are run here on the same step, alternately
(``--repeats``), on one Ray runtime started once (4 CPUs): the wall time and the CPU seconds the
whole machine spent (``/proc/stat``, every Ray process included) from call to checkpoint, and
the largest difference between the two paths' test features (they must agree).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot."""
    values = list(map(int, open("/proc/stat").readline().split()[1:]))
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def toy_config(root: Path, args):
    """A two_model scenario whose old model is given as (untrained, seeded) weights."""
    import torch
    from safetensors.torch import save_file

    from raycompat.config import load_config
    from raycompat.config.train import TrainConfig
    from raycompat.train.export import build_model

    base = [
        "data.name=synthetic",
        f"data.options={{num_classes: {args.classes}, images_per_class: {args.images},"
        " image_size: 28, channels: 1, seed: 3}",
        f"model.num_classes={args.classes}",
        "method=bct",
        "scenario.kind=two_model",
        f"scenario.tasks=[{args.classes // 2},{args.classes}]",
        "scaling.num_workers=1",
        f"run.storage_path={root}",
    ]
    cfg = load_config(TrainConfig, None, base)
    torch.manual_seed(0)
    weights = root / "old.safetensors"
    save_file(build_model(cfg.model).state_dict(), str(weights))
    old = f"{{checkpoint: {weights}, classes: {args.classes // 2}}}"
    return load_config(TrainConfig, None, [*base, f"scenario.old_model={old}"])


def timed(fn) -> tuple[dict, object]:
    wall, cpu = time.perf_counter(), busy_cpu_s()
    checkpoint = fn()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": busy_cpu_s() - cpu}, checkpoint


def alternate(sides: dict, repeats: int) -> tuple[dict, dict, dict]:
    """Run each of ``sides`` (``name -> fn(i) -> checkpoint``) ``repeats`` times, alternating
    which goes first (the machine is shared); ``(runs, test features, medians)``."""
    from raycompat.train.export import load_features

    runs, features = {side: [] for side in sides}, {}
    for i in range(repeats):
        for side in list(sides) if i % 2 == 0 else list(reversed(sides)):
            measured, checkpoint = timed(lambda s=side, n=i: sides[s](n))
            runs[side].append(measured)
            with checkpoint.as_directory() as directory:
                features[side] = load_features(directory, "test")
    med = {
        s: {k: statistics.median(x[k] for x in r) for k in ("wall_s", "cpu_s")}
        for s, r in runs.items()
    }
    return runs, features, med


def arguments(doc: str) -> argparse.ArgumentParser:
    """The toy step's size, ``--repeats`` and ``--out`` (this script's and one_worker_run.py's)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--images", type=int, default=40, help="images per class")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return p


def start_ray(prefix: str) -> Path:
    """One Ray runtime (4 CPUs) for every run; a fresh folder for their files."""
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    return Path(tempfile.mkdtemp(prefix=prefix))


def main(argv: list[str] | None = None) -> dict:
    args = arguments(__doc__).parse_args(argv)
    root = start_ray("given-step-")
    from raycompat.cluster.train import guard
    from raycompat.cluster.train.driver import make_trainer, select_checkpoint
    from raycompat.cluster.train.evaluate import evaluate_step
    from raycompat.io import run_storage
    from raycompat.train.scenarios import plan_steps

    cfg = toy_config(root, args)
    plans = plan_steps(cfg)
    fs, base = run_storage.run_filesystem(cfg.run)

    def run_path(side: str, i: int) -> str:
        fs.create_dir(f"{base}/{side}-{i}", recursive=True)
        return f"{base}/{side}-{i}"

    sides = {
        "task": lambda i: evaluate_step(cfg, plans, 0, None, fs, run_path("task", i))[0],
        "ray_train": lambda i: select_checkpoint(
            guard.fit(make_trainer(cfg, plans, 0, None, fs, run_path("ray_train", i), None))
        )[0],
    }
    return compare("given_step", args, sides)


def compare(benchmark: str, args, sides: dict) -> dict:
    """Alternate the ``task`` and ``ray_train`` sides (:func:`alternate`), stop Ray, and emit
    the report: every run, the medians, their ratios, and the largest feature difference."""
    import ray

    loadavg_start = os.getloadavg()
    runs, features, med = alternate(sides, args.repeats)
    ray.shutdown()
    report = {
        "benchmark": benchmark,
        "machine": {**machine_info(), "loadavg": [loadavg_start, os.getloadavg()]},
        "workload": {**vars(args), "out": None},
        "runs": runs,
        "median": med,
        "saved_wall_s": med["ray_train"]["wall_s"] - med["task"]["wall_s"],
        "ratio_wall_task_to_ray_train": med["task"]["wall_s"] / med["ray_train"]["wall_s"],
        "ratio_cpu_task_to_ray_train": med["task"]["cpu_s"] / med["ray_train"]["cpu_s"],
        "max_feature_difference": float(np.abs(features["task"] - features["ray_train"]).max()),
    }
    emit(report, args.out)
    return report


if __name__ == "__main__":
    main()
