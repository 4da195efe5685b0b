"""Train a sequence of compatible models with Ray Train and grow their compatibility matrix.

    python jobs/train.py --config configs/train_mnist_cores.yaml [key.sub=value ...]
    ray job submit --working-dir . -- python jobs/train.py --config configs/<x>.yaml

Run it again with the same ``run.name`` and ``run.storage_path`` to resume an interrupted run.
Outputs: ``<run.storage_path>/<run.name>/`` with one Ray Train run per step (checkpoints holding
the exported model and its features), ``compatibility.json``, ``state.json``, ``summary.json``,
``config.yaml`` and ``plan.json``.
"""

from __future__ import annotations

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from raycompat.cli.job_entry import announce_outputs, job_config, job_parser  # noqa: E402
from raycompat.config.train import TrainConfig  # noqa: E402
from raycompat.io.credentials import configure_logging, register_secrets  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    args = job_parser(__doc__, "TrainConfig").parse_args(argv)
    configure_logging()  # every log line scrubbed of credentials
    default = "the built-in TrainConfig defaults (TrainConfig() in raycompat/config/train.py)"
    cfg = job_config(TrainConfig, args, default=default, outputs=("run.storage_path",))
    register_secrets(cfg)

    from raycompat.cluster.console import init_ray
    from raycompat.cluster.train.driver import run_training
    from raycompat.train.data import check_weight_files

    check_weight_files(cfg)  # before Ray starts: a missing weights file is one line
    announce_outputs(cfg, ("run.storage_path",))

    init_ray(args.address, args.verbose)  # quiet console unless --verbose
    summary = run_training(cfg).summary()
    logging.getLogger("raycompat.train").info("summary: %s", json.dumps(summary))
    return summary


if __name__ == "__main__":
    from raycompat.cli.errors import run_main

    run_main(main)  # a config error: one line naming the file and key, exit 2
