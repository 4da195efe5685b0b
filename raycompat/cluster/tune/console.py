"""What a sweep prints: one line per finished trial, with the sweep's progress, and no Tune
table.

Tune's own console is a status table every 30 s and two tables per trial (its config, its
result): 19 tables in 285 lines for a sweep of 4 trials (issue 52, item 7). Unless verbose,
:func:`tune_console` turns it off through Tune's own settings: ``RunConfig(verbose=0)`` on
Tune's first output engine (``RAY_AIR_NEW_OUTPUT=0`` for the ``fit``: the newer engine prints
its experiment table and a final status table even when silent). In its place
:class:`TrialLines`, a Tune callback on the driver, logs one line per trial that ends,
through a :class:`~raycompat.progress.Ticker` (every line kept; on a terminal, a bar of the
trials below them)::

    [2/4] trial 3b09e_00001 (method_options.lam=0.1): objective=0.7222 AC=1 AA=0.8426 | ETA 95s

The table of every trial is the sweep's result files (``results/trials.csv``,
:mod:`raycompat.cluster.tune.results`), not the console. ``--verbose`` restores Tune's
console as Ray prints it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator

from ray import tune
from ray.experimental import tqdm_ray

from raycompat.progress import Ticker, stage_line

log = logging.getLogger("raycompat.cluster.tune")

NEW_OUTPUT_ENV = "RAY_AIR_NEW_OUTPUT"  # "0": Tune's first output engine, silent at verbose 0
SHOWN = ("objective", "AC", "AA")  # a finished trial's metrics on its line


def run_verbosity(verbose: bool) -> int | None:
    """``RunConfig(verbose=...)`` of a sweep: Tune's default when ``verbose``, else silent."""
    return None if verbose else 0


@contextlib.contextmanager
def tune_console(verbose: bool) -> Iterator[None]:
    """Around a ``Tuner.fit()``: Tune's first output engine unless ``verbose`` (Tune reads
    ``RAY_AIR_NEW_OUTPUT`` when ``fit`` starts); the environment is restored after."""
    if verbose:
        yield
        return
    before = os.environ.get(NEW_OUTPUT_ENV)
    os.environ[NEW_OUTPUT_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NEW_OUTPUT_ENV, None)
        else:
            os.environ[NEW_OUTPUT_ENV] = before


# Tune's results reader: on a restore it warns of every trial that has reported nothing yet
# ("Failed to fetch metrics ... result.json and progress.csv were not found"), which is what a
# sweep stopped before that trial's first report always holds; the restored trial runs again.
RESULTS_READER = "ray.tune.analysis.experiment_analysis"


@contextlib.contextmanager
def quiet_restore(verbose: bool) -> Iterator[None]:
    """Around a ``Tuner.restore``: unless ``verbose``, no warning of Tune's results reader
    about trials without results (they are resumed; the sweep's own line says it restores)."""
    reader = logging.getLogger(RESULTS_READER)
    before = reader.level
    if not verbose:
        reader.setLevel(logging.ERROR)
    try:
        yield
    finally:
        reader.setLevel(before)


def trial_outcome(trial) -> str:
    """What a trial that ended gave: its final metrics, that its scheduler stopped it, or
    where its error is."""
    if trial.status == trial.ERROR:
        return f"failed (error in {trial.error_file})" if trial.error_file else "failed"
    result = trial.last_result or {}
    if not result.get("final"):
        return f"stopped by the scheduler after {result.get('training_iteration', 0)} reports"
    shown = [f"{k}={result[k]:.4g}" for k in SHOWN if isinstance(result.get(k), int | float)]
    return " ".join(shown)


def trial_line(trial, position: int, total: int, params: list[str], eta_s: float | None) -> str:
    """``[position/total] trial <id> (<param>=<value>, ...): <outcome> | ETA <s>s``."""
    chosen = ", ".join(f"{k}={trial.config.get(k)}" for k in params)
    subject = f"trial {trial.trial_id}" + (f" ({chosen})" if chosen else "")
    return stage_line(position, total, subject, trial_outcome(trial), eta_s)


class TrialLines(tune.Callback):
    """One line per trial that ends (finished, stopped or failed), numbered among the sweep's
    trials, with the ETA at the mean pace of those this run has ended (trials a restored
    sweep had finished count as done, not as pace)."""

    def __init__(self, name: str, params: list[str]) -> None:
        self.name, self.params = name, params
        self.total, self.ended, self.ticker = 0, 0, None
        self.start = time.perf_counter()

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info) -> None:
        self.total, self.start = int(total_num_samples or 0), time.perf_counter()
        self.ticker = Ticker(
            log, self.total, f"sweep {self.name}", "trial", every_step=True, bar=tqdm_ray.tqdm
        )

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.trial_ended(trials, trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.trial_ended(trials, trial)

    def trial_ended(self, trials, trial) -> None:
        self.ended += 1
        done = {t.trial_id for t in trials if t.status in (t.TERMINATED, t.ERROR)}
        position = len(done | {trial.trial_id})
        total = max(self.total, len(trials), position)
        left = total - position
        pace = (time.perf_counter() - self.start) / self.ended
        line = trial_line(trial, position, total, self.params, pace * left if left else None)
        self.ticker.step(line, last=not left)

    def on_experiment_end(self, trials, **info) -> None:
        if self.ticker is not None:
            self.ticker.close()
