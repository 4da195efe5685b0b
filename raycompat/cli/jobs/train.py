"""Train a sequence of compatible models with Ray Train and grow their compatibility matrix.

    raycompat-train --config configs/train_mnist_cores.yaml   # the console script: the same job
    python jobs/train.py --config configs/train_mnist_cores.yaml [key.sub=value ...]
    ray job submit --working-dir . -- python jobs/train.py --config configs/<x>.yaml \\
        --output-root "$PWD"   # docs/cluster.md, "Paths of a submitted job"

Run it again with the same ``run.name`` and ``run.storage_path`` to resume an interrupted run.
Outputs: ``<run.storage_path>/<run.name>/`` with one Ray Train run per step (checkpoints holding
the exported model and its features), ``compatibility.json``, ``state.json``, ``summary.json``,
``config.yaml`` and ``plan.json``.
"""

from __future__ import annotations

import logging

from raycompat.cli.job_entry import (
    announce_outputs,
    console_script,
    job_config,
    job_parser,
    log_summary,
)
from raycompat.cli.job_paths import train_inputs
from raycompat.config.train import TrainConfig
from raycompat.console import configure_console
from raycompat.io.credentials import register_secrets

OUTPUTS = ("run.storage_path",)  # its paths: raycompat/cli/job_paths.py
# What runs without --config (named in --help and logged at start).
DEFAULT = "the built-in TrainConfig defaults (TrainConfig() in raycompat/config/train.py)"
# Shown under "examples:" in --help; tests/cli/test_help_examples.py loads every one.
EXAMPLES = (
    "raycompat-train --config configs/train_mnist_cores.yaml",
    "raycompat-train --config configs/train_mnist_cores.yaml epochs=2 optim.lr=0.001",
    "raycompat-train --config configs/train_mnist_cl2r.yaml scaling.num_workers=1 run.name=cl2r-1",
)


def main(argv: list[str] | None = None) -> dict:
    args = job_parser(__doc__, "TrainConfig", default=DEFAULT, examples=EXAMPLES).parse_args(argv)
    configure_console(args.verbose)  # every log line scrubbed of credentials
    cfg = job_config(TrainConfig, args, default=DEFAULT, outputs=OUTPUTS, inputs=train_inputs)
    register_secrets(cfg)

    from raycompat.config.checks import check_weight_files

    check_weight_files(cfg)  # before torch and Ray load: a missing weights file is one line
    announce_outputs(cfg, OUTPUTS, inputs=train_inputs(cfg), dry_run=args.dry_run)
    from raycompat.cluster.console import init_ray
    from raycompat.cluster.train.driver import run_training

    init_ray(args.address, args.verbose)  # quiet console unless --verbose
    return log_summary(logging.getLogger("raycompat.train"), run_training(cfg).summary())


run = console_script(
    main,
    "raycompat-train",
    resumes="rerunning the same command resumes from the run's last checkpoint",
)


if __name__ == "__main__":
    run()
