"""Sweep compatibility trade-offs with Ray Tune over the training driver.

    raycompat-tune --config configs/tune_hoc_lambda.yaml   # the console script: the same job
    python jobs/tune.py --config configs/tune_hoc_lambda.yaml [key.sub=value ...]
    ray job submit --working-dir . -- python jobs/tune.py --config configs/tune_hoc_lambda.yaml \\
        --output-root "$PWD"   # docs/cluster.md, "Paths of a submitted job"

Run it again with the same ``name`` and ``storage_path`` to resume an interrupted sweep (errored
trials are retried, finished ones kept). ``storage_path`` is a local (or shared) folder or an
``s3://`` prefix (``storage_options=`` as the store's, e.g. for an S3-compatible endpoint).
Outputs in ``<storage_path>/<name>/``: Tune's state,
one training run per trial under ``runs/``, and ``results/`` with ``trials.csv``,
``trials.parquet``, ``best_config.yaml`` (ready for ``jobs/train.py``) and ``tradeoff.png``.
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
from raycompat.config.tune import SweepConfig
from raycompat.console import configure_console

# What runs without --config (named in --help and logged at start).
DEFAULT = "the built-in SweepConfig defaults (a grid over configs/train_mnist_cores.yaml)"
# Shown under "examples:" in --help; tests/cli/test_help_examples.py loads every one. A sweep's
# own keys are not the training config's: those go in overrides, applied to base per trial.
EXAMPLES = (
    "raycompat-tune --config configs/tune_hoc_lambda.yaml",
    "raycompat-tune --config configs/tune_cores_epochs.yaml 'space.0.values=[1,2]' name=short",
    "raycompat-tune 'overrides=[epochs=2]'   # a training key: set in every trial's config",
    "raycompat-tune --config configs/tune_lr_asha.yaml storage_path=s3://bucket/sweeps",
)


OUTPUTS = ("storage_path",)  # its paths: raycompat/cli/job_paths.py


def inputs(sweep: SweepConfig) -> list[str]:
    return ["base"]  # a training config; its own paths are checked by check_base


def check_base(sweep: SweepConfig) -> None:
    """The base training config loads with the sweep's overrides and names weights files that
    exist, before Ray starts (a typo there is one line, not a failed trial per grid point)."""
    from raycompat.config import load_config
    from raycompat.config.checks import check_weight_files
    from raycompat.config.train import TrainConfig

    check_weight_files(load_config(TrainConfig, sweep.base, sweep.overrides), f"{sweep.base}: ")


def main(argv: list[str] | None = None) -> dict:
    args = job_parser(__doc__, "SweepConfig", default=DEFAULT, examples=EXAMPLES).parse_args(argv)
    # Scrubs the environment's credentials (a sweep config holds none: its ParamSpec.key
    # is a config key, not an access key, so the config is not registered).
    verbose = configure_console(args.verbose)
    sweep = job_config(SweepConfig, args, default=DEFAULT, outputs=OUTPUTS, inputs=inputs)
    check_base(sweep)
    announce_outputs(sweep, OUTPUTS, inputs=inputs(sweep), dry_run=args.dry_run)

    from raycompat.cluster.console import init_ray
    from raycompat.cluster.tune.results import publish_outputs
    from raycompat.cluster.tune.sweep import run_sweep

    init_ray(args.address, verbose)  # quiet console unless --verbose
    results = run_sweep(sweep, verbose)  # a line per trial; Tune's tables only with --verbose
    summary = publish_outputs(results, sweep)
    return log_summary(logging.getLogger("raycompat.cluster.tune"), summary, "sweep summary")


run = console_script(
    main,
    "raycompat-tune",
    resumes="rerunning the same command restores the sweep: finished trials are kept",
)


if __name__ == "__main__":
    run()
