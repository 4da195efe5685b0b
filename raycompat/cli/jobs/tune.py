"""Sweep compatibility trade-offs with Ray Tune over the training driver.

    raycompat-tune --config configs/tune_hoc_lambda.yaml   # the console script: the same job
    python jobs/tune.py --config configs/tune_hoc_lambda.yaml [key.sub=value ...]
    ray job submit --working-dir . -- python jobs/tune.py --config configs/tune_hoc_lambda.yaml

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


def main(argv: list[str] | None = None) -> dict:
    args = job_parser(__doc__, "SweepConfig", default=DEFAULT).parse_args(argv)
    # Scrubs the environment's credentials (a sweep config holds none: its ParamSpec.key
    # is a config key, not an access key, so the config is not registered).
    configure_console(args.verbose)
    sweep = job_config(SweepConfig, args, default=DEFAULT, outputs=("storage_path",))

    from raycompat.cluster.console import init_ray
    from raycompat.cluster.tune.results import publish_outputs
    from raycompat.cluster.tune.sweep import run_sweep

    announce_outputs(sweep, ("storage_path",))
    init_ray(args.address, args.verbose)  # quiet console unless --verbose
    results = run_sweep(sweep)
    summary = publish_outputs(results, sweep)
    return log_summary(logging.getLogger("raycompat.cluster.tune"), summary, "sweep summary")


run = console_script(
    main,
    "raycompat-tune",
    resumes="rerunning the same command restores the sweep: finished trials are kept",
)


if __name__ == "__main__":
    run()
