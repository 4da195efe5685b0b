"""A run of one training worker: one Ray task vs a Ray Train worker group.

    .venv/bin/python benchmarks/one_worker_run.py --out benchmarks/results/one_worker_run_cpu.json

The upgrade job trains every model and every FCT ``h`` with one worker by default
(``scaling.num_workers: 1``). Such a run trains in one task
(:mod:`raycompat.cluster.train.task_run`) unless ``scaling.one_worker_runner: ray_train``. Both
run here on the same step, alternately (``--repeats``), on one Ray runtime started once (4
CPUs): an ``independent`` step of ``--epochs`` epochs on synthetic identities (LeNet++, 1
worker, 1 CPU). Reported: the wall time and the CPU seconds the whole machine spent
(``/proc/stat``, every Ray process included) from call to selected checkpoint, their medians and
ratios, and the largest difference between the two paths' test features (the same loop, seeds
and data: they must agree).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from given_step import arguments, compare, start_ray  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = arguments(__doc__)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args(argv)
    root = start_ray("one-worker-run-")
    from raycompat.cluster.train.driver import run_training
    from raycompat.config import load_config
    from raycompat.config.train import TrainConfig

    base = [
        "data.name=synthetic",
        f"data.options={{num_classes: {args.classes}, images_per_class: {args.images},"
        " image_size: 28, channels: 1, seed: 3}",
        f"model.num_classes={args.classes}",
        "method=independent",
        f"scenario.tasks=[{args.classes}]",
        f"epochs={args.epochs}",
        "scaling.num_workers=1",
    ]

    def step(side: str, i: int):
        overrides = [f"scaling.one_worker_runner={side}", f"run.storage_path={root}/{side}-{i}"]
        return run_training(load_config(TrainConfig, None, [*base, *overrides])).checkpoints[
            "step_1"
        ]

    sides = {side: lambda i, s=side: step(s, i) for side in ("task", "ray_train")}
    return compare("one_worker_run", args, sides)


if __name__ == "__main__":
    main()
