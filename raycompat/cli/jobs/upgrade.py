"""Upgrade a gallery's embedding model: train, evaluate, decide, publish, report.

    raycompat-upgrade --config configs/upgrade_mnist.yaml   # the console script: the same job
    python jobs/upgrade.py                                  # the embedded MNIST-5k history
    python jobs/upgrade.py --config configs/upgrade_mnist.yaml [key.sub=value ...]
    ray job submit --working-dir . -- python jobs/upgrade.py --config configs/<x>.yaml \\
        --output-root "$PWD"   # docs/cluster.md, "Paths of a submitted job"

For every entry of ``upgrades`` (in order): the first model of an empty store is trained and the
gallery is extracted with it; every later model is trained on Ray Train against the model the
gallery is stored in, scored against every registered model on the shared test images, and then

- registered as a query model of the current gallery version (``compatible``: ECC holds),
- or, for an FCT method, the gallery is transformed by Ray Data into a new version, which is
  checked before it is published (``transform``), with a fraction of its rows re-extracted by
  the new model when the entry asks for a ``partial_backfill`` (FastFill),
- or refused (the default) / backfilled by re-extraction, fully or, for FCT, partially
  (``policy.on_incompatible``).

Nothing is published before its checks pass. Entries an earlier run published are not redone,
so rerunning the same config resumes or does nothing; entries it refused, or that failed, are
recorded in the store and skipped while their config is unchanged (``--retry`` judges them
again). One job per gallery at a time: a second job on the gallery while one is live is refused
at start, naming the live one (``raycompat/upgrade/lock.py``). The report lands in
``<report_dir>/<name>/`` (``report.md``, ``matrix.png``, ``report.json``...); a rerun that
publishes nothing new leaves it byte for byte as it was, and a run that does moves the earlier
one into ``earlier/<UTC time>/`` first (``raycompat/upgrade/report_folder.py``). A refusal is a
decision, not a failure: the exit status is 0 unless ``--fail-on-refuse`` is given and a decision
is one the policy does not allow (then 3: an entry refused although ``policy.on_incompatible``
asks for a backfill, or one that failed, before too; README.md, "Exit status").
"""

from __future__ import annotations

import logging
import os
import sys
import time

from raycompat.cli.job_entry import (
    announce_outputs,
    console_script,
    job_config,
    job_parser,
    log_summary,
)
from raycompat.cli.job_paths import image_inputs, train_inputs
from raycompat.config import to_dict
from raycompat.config.upgrade import PolicySpec, UpgradeConfig, check_upgrade_config
from raycompat.console import configure_console

log = logging.getLogger("raycompat.jobs.upgrade")
REFUSED_EXIT = 3
# Its paths (raycompat/cli/job_paths.py: one rule for every job's inputs and outputs).
OUTPUTS = ("store.root", "report_dir", "work_dir", "training.run.storage_path")


def inputs(cfg: UpgradeConfig) -> list[str]:
    return train_inputs(cfg.training, "training.") + image_inputs(
        cfg.gallery_images, "gallery_images."
    )


# What runs without --config (named in --help and logged at start).
DEFAULT = "the embedded MNIST-5k open-set history (configs/upgrade_mnist.yaml spells it out)"
# Shown under "examples:" in --help; tests/cli/test_help_examples.py loads every one.
EXAMPLES = (
    "raycompat-upgrade   # the embedded history",
    "raycompat-upgrade --config configs/upgrade_mnist.yaml training.epochs=1",
    "raycompat-upgrade --config configs/upgrade_mnist.yaml upgrades.2.fct.epochs=5 "
    "policy.on_incompatible=backfill",
    "raycompat-upgrade --config configs/upgrade_mnist_closed.yaml store.root=/shared/store",
)


def main(argv: list[str] | None = None) -> dict:
    parser = job_parser(__doc__, "UpgradeConfig", default=DEFAULT, examples=EXAMPLES)
    parser.add_argument(
        "--fail-on-refuse",
        action="store_true",
        help=f"exit with status {REFUSED_EXIT} when an entry failed, or was refused although "
        "policy.on_incompatible asks for a backfill (for automation); a refusal under "
        "on_incompatible=refuse is the policy's own answer (exit 0)",
    )
    parser.add_argument(
        "--retry",
        action="store_true",
        help="judge again the upgrades an earlier run refused or that failed under the same "
        "config (by default they are skipped, and the log says so)",
    )
    args = parser.parse_args(argv)
    configure_console(args.verbose)  # every log line scrubbed of credentials
    cfg = job_config(
        UpgradeConfig,
        args,
        default=DEFAULT,
        outputs=OUTPUTS,
        inputs=inputs,
        check=check_upgrade_config,  # --print-config too: names, methods, options, files
    )
    announce_outputs(cfg, OUTPUTS, inputs=inputs(cfg), dry_run=args.dry_run)

    from raycompat.cli.errors import error_line
    from raycompat.cli.store_options import JOB_HINT, reach_store
    from raycompat.store import GalleryStore
    from raycompat.upgrade.lock import UpgradeRunningError, upgrade_lease

    began = time.perf_counter()
    store = GalleryStore(
        cfg.store.root, cfg.store.storage_options, lease_timeout_s=cfg.store.lease_timeout_s
    )
    reach_store(store, JOB_HINT)  # an unreachable store is one line, before Ray starts
    try:  # before Ray starts: a second job on the gallery stops here, naming the live one
        with upgrade_lease(store, cfg.store.gallery, cfg.store.lease_timeout_s) as lease:
            summary = run_history(args, cfg, store, lease, began)
    except UpgradeRunningError as error:
        raise SystemExit(error_line(os.path.basename(sys.argv[0]) or "upgrade", error)) from None
    if args.fail_on_refuse:
        fail_on_refuse(summary["decisions"], cfg.policy)
    return summary


def fail_on_refuse(decisions: dict[str, str], policy: PolicySpec) -> None:
    """``--fail-on-refuse``: exit :data:`REFUSED_EXIT` when a decision is one the policy does
    not allow (:func:`raycompat.upgrade.policy.allowed_by`): an entry that failed, or one refused
    although ``policy.on_incompatible`` asks for a backfill. A refusal under
    ``on_incompatible=refuse`` is the policy's own answer: the shipped history's m2 ends 0."""
    from raycompat.upgrade.policy import allowed_by

    against = [m for m, action in decisions.items() if not allowed_by(action, policy)]
    if against:
        from raycompat.cli.job_exit import JobExit

        done = {"refuse": "refused", "failed": "failed"}
        which = ", ".join(f"{m} {done.get(decisions[m], decisions[m])}" for m in against)
        reason = f"{which} (policy.on_incompatible={policy.on_incompatible}; --fail-on-refuse)"
        raise JobExit(REFUSED_EXIT, reason)


def run_history(args, cfg: UpgradeConfig, store, lease, began: float) -> dict:
    """Steps 1-4 under the job lease: every entry of the history, then the report."""
    from raycompat.cluster.console import init_ray
    from raycompat.cluster.upgrade.job import Upgrader
    from raycompat.store.catalog.models import Catalog
    from raycompat.store.read.listing import gallery_versions
    from raycompat.train.data import describe_split
    from raycompat.upgrade.committed_range import committed_lines
    from raycompat.upgrade.evaluate import eval_data, history_matrix
    from raycompat.upgrade.report import Report, write_report
    from raycompat.upgrade.report_folder import archive, has_report

    init_ray(args.address or cfg.ray_address, args.verbose)  # quiet console unless --verbose
    data = eval_data(cfg.training)
    upgrader = Upgrader(cfg, store, Catalog(store), data, retry=args.retry, lease=lease)
    upgrader.load_registered()

    # 1-3. Each model of the history: train, evaluate, decide and act (or skip if published).
    outcomes = [upgrader.run(position) for position in range(len(cfg.upgrades))]

    # 4. The report: the whole history's matrix, the decisions, the published versions.
    matrix = history_matrix(upgrader.features.order, upgrader.features, data)
    report = Report(
        cfg.name,
        cfg.training.eval.protocol,
        matrix,
        outcomes,
        gallery_versions(store, cfg.store.gallery),
        seconds=time.perf_counter() - began,
        split=describe_split(cfg.training),
    )
    directory = os.path.join(cfg.report_dir, cfg.name)
    unchanged = all(o.resumed for o in outcomes) and has_report(directory)
    if unchanged:
        log.info("nothing new was published: the report in %s is left as it was", directory)
    else:
        if (earlier := archive(directory)) is not None:
            log.info("the earlier report moved to %s", earlier)
        planar = upgrader.features.planar(data.eval_set.labels)  # the 2-d feature plots
        write_report(directory, report, to_dict(cfg), planar)
    summary = {
        **report.summary(),
        "report": os.path.join(directory, "report.md"),
        "report_written": not unchanged,
    }
    log_summary(log, summary)
    for line in committed_lines(outcomes, cfg):  # where this run falls in the seeds' spread
        log.info("%s", line)
    return summary


run = console_script(
    main,
    "raycompat-upgrade",
    resumes="rerunning the same command resumes: published entries are kept and training "
    "goes on from its last checkpoint",
)


if __name__ == "__main__":
    run()
