"""Ray Tune over the training driver (Train V2 pattern: the Tuner runs a driver function that
builds its own ``TorchTrainer`` s; never ``Tuner(trainer)``).

Each trial applies its parameters to the base training config, runs
:func:`raycompat.cluster.train.driver.run_training` under ``<storage>/<sweep>/runs/<trial id>``
(so a restored trial resumes its own training run), and reports:

- every epoch, through a :class:`TuneReportCallback` on each step's trainer, with ``objective``
  set to the objective's per-epoch proxy (what ASHA compares);
- once at the end, the objective and AC/AA/ACA/self-test of the validation matrix.

Each trainer also carries a :class:`~raycompat.cluster.tune.reaper.PlacementGroupReaper`, so a
trial that ASHA stops mid-training gives its workers' CPUs back to the next trials. A step of
one worker trains in one Ray task instead of a trainer (as outside sweeps,
:mod:`raycompat.cluster.train.task_run`): both callbacks follow its reports, and a stopped
trial's task ends with the trial's actor.

The console gets one line per trial that ends, not Tune's tables (:mod:`.console`).

Running the same sweep again restores it from its storage path (errored trials are retried).
The storage path is a local (or shared) folder or an ``s3://`` prefix: Tune's state, every
trial's training runs and the results all live there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile

import pyarrow.fs as pafs
import ray
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler

from raycompat.cluster.train.driver import matrix_summary, run_training
from raycompat.cluster.tune import interrupt
from raycompat.cluster.tune.console import TrialLines, quiet_restore, run_verbosity, tune_console
from raycompat.cluster.tune.fct import (
    backfill_of,
    check_transformation,
    split_params,
    transformation_of,
    transformed_val_matrix,
)
from raycompat.cluster.tune.objectives import PROXY, objective
from raycompat.cluster.tune.reaper import PlacementGroupReaper
from raycompat.cluster.tune.space import param_space, trial_overrides
from raycompat.config import apply_overrides, load_config
from raycompat.config.train import ScalingSpec, TrainConfig
from raycompat.config.tune import SweepConfig
from raycompat.errors import ConfigError
from raycompat.io.uri import filesystem
from raycompat.metrics.compatibility import CompatibilityMatrix

log = logging.getLogger(__name__)

# A trial's driver only waits on its trainers (their workers hold the real resources), but Tune
# refuses a trial that asks for nothing.
DRIVER_CPUS = 0.01


class ObjectiveReportCallback(TuneReportCallback):
    """Forward each epoch's report to Tune with ``objective`` = the per-epoch proxy."""

    def __init__(self, proxy: str) -> None:
        super().__init__()
        self.proxy = proxy

    def after_report(self, run_context, metrics, checkpoint):
        super().after_report(run_context, [self.with_objective(m) for m in metrics], None)

    def task_report(self, metrics: dict) -> None:
        """A one-worker step trained in a task (``task_run``): this runs in the trial's own
        process, which reports to Tune directly."""
        tune.report(self.with_objective(metrics))

    def with_objective(self, metrics: dict) -> dict:
        return {**metrics, "objective": float(metrics.get(self.proxy, float("nan")))}


def trial_config(base: TrainConfig, sweep: SweepConfig, params: dict, trial_id: str) -> TrainConfig:
    cfg = apply_overrides(base, trial_overrides(split_params(params)[0]))
    run = dataclasses.replace(
        cfg.run, name=trial_id, storage_path=runs_path(sweep), storage_options=sweep.storage_options
    )
    return dataclasses.replace(cfg, run=run)


def is_remote(sweep: SweepConfig) -> bool:
    return "://" in sweep.storage_path and not sweep.storage_path.startswith("file://")


def sweep_path(sweep: SweepConfig) -> str:
    """``<storage_path>/<name>``: an absolute local path, or the ``s3://`` URI."""
    if is_remote(sweep):
        return f"{sweep.storage_path.rstrip('/')}/{sweep.name}"
    return os.path.join(os.path.abspath(sweep.storage_path.removeprefix("file://")), sweep.name)


def runs_path(sweep: SweepConfig) -> str:
    return f"{sweep_path(sweep)}/runs"


def sweep_storage(sweep: SweepConfig) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path of <storage_path> in it)``, as Tune's ``storage_filesystem`` wants:
    the one I/O resolver's, from the sweep's ``storage_options``."""
    try:
        return filesystem(sweep.storage_path, sweep.storage_options)
    except ValueError as err:
        raise ValueError(f"storage_path: {err}") from None


def check_storage(sweep: SweepConfig) -> None:
    """Create the sweep's folder, so a wrong path, endpoint or credentials fail before Ray
    starts a trial, with the location named (never the credentials)."""
    fs, base = sweep_storage(sweep)
    try:
        fs.create_dir(f"{base}/{sweep.name}", recursive=True)
        fs.get_file_info(f"{base}/{sweep.name}")
    except OSError as err:
        hint = (
            "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the instance "
            "role, or storage_options key/secret) and storage_options.client_kwargs.endpoint_url"
            if is_remote(sweep)
            else "check that the folder is writable"
        )
        raise PermissionError(f"sweep storage {sweep_path(sweep)}: {err}; {hint}") from None


def scratch_dir(sweep: SweepConfig):
    """Context manager over the local folder for a trial's working files (FCT triples and h):
    ``<sweep>/work`` when the sweep is local (kept, for inspection), a temporary folder
    (removed afterwards) when it lives on S3."""
    if is_remote(sweep):
        return tempfile.TemporaryDirectory(prefix=f"raycompat-{sweep.name}-")
    return contextlib.nullcontext(os.path.join(sweep_path(sweep), "work"))


def make_trainable(sweep: SweepConfig):
    # Loaded here, on the submitting machine: trials run in their own folders (and nodes),
    # where a relative path to the base config would not resolve.
    base = load_config(TrainConfig, sweep.base, sweep.overrides)

    def train_driver(params: dict) -> None:
        cfg = trial_config(base, sweep, params, tune.get_context().get_trial_id())
        callbacks = [ObjectiveReportCallback(PROXY[sweep.objective]), PlacementGroupReaper()]
        result = run_training(cfg, callbacks=callbacks)
        if result.val_matrix is None:
            raise ValueError("sweeps score the validation split: set eval.val_fraction > 0")
        matrix, final = result.val_matrix, {}
        fct = transformation_of(sweep, params)
        if fct is not None:
            run = dataclasses.replace(cfg.run, name=f"{cfg.run.name}-h")
            with scratch_dir(sweep) as work:
                matrix, final = transformed_val_matrix(
                    cfg, result, fct, run, work, backfill_of(sweep, params)
                )
        # The run's location as a user names it (trial_config put it under runs_path): an
        # absolute folder, or the full s3:// URI.
        run_path = f"{cfg.run.storage_path}/{cfg.run.name}"
        tune.report({**final, **final_metrics(sweep, matrix, final), "run_path": run_path})

    return train_driver


def final_metrics(
    sweep: SweepConfig, matrix: CompatibilityMatrix, extra: dict | None = None
) -> dict:
    """What a finished trial reports: the objective and the validation matrix's metrics;
    ``extra`` (an FCT trial's ``stored_cross_test`` and ``backfill_*`` metrics) is what the
    objectives that are not read off the matrix read."""
    summary = {**matrix_summary(matrix), **(extra or {})}
    final = {k: summary[k] for k in ("AC", "AA", "ACA") if k in summary}
    final["self_test"] = objective("self_test")(summary, matrix)
    if len(matrix) > 1:
        c = matrix.as_array()
        final["cross_test"], final["old_self_test"] = float(c[-1, -2]), float(c[-2, -2])
    final["objective"] = objective(sweep.objective)(summary, matrix)
    return {**final, "final": True}


def concurrency(sweep: SweepConfig) -> int:
    """``max_concurrent_trials``, or as many trials as the cluster's resources hold."""
    if sweep.max_concurrent_trials:
        return sweep.max_concurrent_trials
    cfg = load_config(TrainConfig, sweep.base, sweep.overrides)
    return trials_that_fit(ray.cluster_resources(), cfg.scaling)


def trials_that_fit(resources: dict, scaling: ScalingSpec) -> int:
    """Trials that run at once (at least 1): each holds its workers' CPUs (and GPUs) plus its
    driver's ``DRIVER_CPUS``; a trial that does not fit would wait for workers while holding
    its place."""
    trial_cpus = scaling.num_workers * scaling.cpus_per_worker + DRIVER_CPUS
    fits = int(resources.get("CPU", 0) // trial_cpus)
    if scaling.use_gpu:
        fits = min(fits, int(resources.get("GPU", 0) // scaling.num_workers))
    return max(1, fits)


def epoch_reports(sweep: SweepConfig, base: TrainConfig) -> int:
    """Per-epoch reports of the longest trial: every planned step's epochs, with ``epochs``
    at its largest value when the space searches it."""
    from raycompat.train.scenarios import plan_steps

    epochs = [base.epochs]
    for spec in sweep.space:
        if spec.key == "epochs":
            epochs += [*spec.values, *([spec.high] if spec.high is not None else [])]
    cfg = dataclasses.replace(base, epochs=int(max(epochs)))
    return sum(plan.epochs for plan in plan_steps(cfg))


def check_asha(sweep: SweepConfig, base: TrainConfig) -> None:
    """ASHA stops every trial that reaches ``max_t``; a trial reports once per epoch and then
    its final metrics, so ``max_t`` must exceed the epoch reports or no trial would finish."""
    if sweep.asha is None:
        return
    reports = epoch_reports(sweep, base)
    if sweep.asha.max_t <= reports:
        raise ConfigError(
            f"asha.max_t={sweep.asha.max_t}: a trial reports {reports} epochs (all its models) "
            f"before its final metrics, and ASHA stops trials at max_t; set asha.max_t to at "
            f"least {reports + 1}"
        )


def search_algorithm(sweep: SweepConfig):
    if sweep.search == "optuna":
        if any(p.kind == "grid" for p in sweep.space):
            raise ValueError("search: optuna samples its own points; use choice, not grid")
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(metric="objective", mode="max", seed=sweep.seed)
    if sweep.search == "random" and any(p.kind == "grid" for p in sweep.space):
        log.info("random search with grid parameters: every grid point is sampled num_samples x")
    return None


def make_tuner(sweep: SweepConfig, verbose: bool = False) -> tune.Tuner:
    """The sweep's ``Tuner`` (restored from its storage when it has run before): Tune's console
    off unless ``verbose``, one line per trial that ends instead (:mod:`.console`)."""
    trainable = tune.with_resources(make_trainable(sweep), {"CPU": DRIVER_CPUS})
    fs, base = sweep_storage(sweep)
    folder = f"{base}/{sweep.name}"
    if tune.Tuner.can_restore(folder, storage_filesystem=fs):
        log.info("restoring sweep %s (errored trials are retried)", sweep_path(sweep))
        with quiet_restore(verbose):  # trials that reported nothing yet: resumed, not news
            return tune.Tuner.restore(folder, trainable, resume_errored=True, storage_filesystem=fs)
    scheduler = None
    if sweep.asha is not None:
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=sweep.asha.max_t,
            grace_period=sweep.asha.grace_period,
            reduction_factor=sweep.asha.reduction_factor,
        )
    return tune.Tuner(
        trainable,
        param_space=param_space(sweep.space),
        tune_config=tune.TuneConfig(
            metric="objective",
            mode="max",
            num_samples=sweep.num_samples,
            search_alg=search_algorithm(sweep),
            scheduler=scheduler,
            max_concurrent_trials=concurrency(sweep),
        ),
        run_config=tune.RunConfig(
            name=sweep.name,
            storage_path=base,
            storage_filesystem=fs,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            verbose=run_verbosity(verbose),
            callbacks=[TrialLines(sweep.name, [s.key for s in sweep.space])],
        ),
    )


def run_sweep(sweep: SweepConfig, verbose: bool = False):
    """Fit (or restore) the sweep and return its ``ResultGrid``; Ctrl-C stops it (its state
    saved, so the same command restores it) and raises ``KeyboardInterrupt``
    (:mod:`raycompat.cluster.tune.interrupt`). Tune's own console only when ``verbose``
    (:func:`~raycompat.cluster.tune.console.tune_console`)."""
    base = load_config(TrainConfig, sweep.base, sweep.overrides)  # fails before any trial
    param_space(sweep.space)
    check_transformation(sweep, base)
    check_asha(sweep, base)
    check_storage(sweep)
    with tune_console(verbose):
        return interrupt.fit(make_tuner(sweep, verbose))  # Ctrl-C: KeyboardInterrupt
