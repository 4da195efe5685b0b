"""A run of one training worker as one Ray task, instead of a Ray Train worker group.

A Ray Train run starts a controller and a worker group: two fresh processes importing torch and
Ray Train, a placement group and a process group, about 9 s before the first batch and 1 s
after the last (measured here, ``benchmarks/one_worker_run.py``), for nothing a single worker
with the plain strategy uses. Such a run (:func:`runs_in_task`: one worker, strategy ``ddp``,
no Ray Data shards, no callbacks such as a Tune sweep's) trains in one task on a pooled worker
process. The worker loop is the same function; it sees a :class:`TaskSession` instead of Ray
Train's, which keeps what Ray Train kept:

- checkpoints in the same place, ``<run path>/<name>/checkpoint_epoch<NNNN>/``, listed with
  their metrics in ``<run path>/<name>/task_run.json`` (written after each copy: a folder the
  record does not list is an interrupted copy, written again);
- the ``run.checkpoints_to_keep`` best by the score attribute (the latest too, to resume from);
  only folders the record lists are ever deleted;
- every report as a line of ``<run path>/metrics.jsonl``, as the ``MetricsLog`` callback writes;
- ``run.max_failures`` retries after the loop raised or its process died, each resuming from
  the latest checkpoint, and none after a non-finite step
  (:class:`~raycompat.engine.NonFiniteError`, raised alone);
- rerunning the same config resumes from the record;
- each report reaches the driver as it is made, so callbacks that follow a run's reports (a
  Tune sweep's, which forward each epoch to Tune) follow a task run too: a callback with a
  ``task_report(metrics)`` method is called in the driver with each report's metrics, in
  order, once each. The task streams them (its loop runs in a thread of the task's process,
  and the task yields each report); the reports of an attempt whose process died before it
  yielded them are read back from ``metrics.jsonl``.

A callback without ``task_report`` keeps its run on Ray Train. A trial that a Tune scheduler
stops ends its task with it: the trial's actor owns the task, and Ray kills a task whose owner
died. ``scaling.one_worker_runner: ray_train`` keeps such runs on Ray Train.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import ray
import ray.train
import torch
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raycompat.cluster.train import session
from raycompat.cluster.train.epoch_log import METRICS_FILE
from raycompat.engine import NonFiniteError
from raycompat.io import run_storage as storage

log = logging.getLogger(__name__)
RECORD = "task_run.json"


def runs_in_task(scaling, datasets=None, callbacks=None) -> bool:
    """Whether a run of ``scaling`` trains in one task (see the module's docstring)."""
    return (
        scaling.one_worker_runner == "task"
        and scaling.num_workers == 1
        and scaling.strategy == "ddp"
        and not datasets
        and all(follows_tasks(callback) for callback in callbacks or ())
    )


def follows_tasks(callback) -> bool:
    """Whether ``callback`` can follow a task run's reports (it has ``task_report``)."""
    return callable(getattr(callback, "task_report", None))


@dataclass
class TaskResult:
    """What the drivers read of a ``ray.train.Result``: the latest checkpoint and its metrics,
    and every kept checkpoint with its metrics."""

    checkpoint: ray.train.Checkpoint | None
    metrics: dict | None
    best_checkpoints: list[tuple[ray.train.Checkpoint, dict]] = field(default_factory=list)
    path: str = ""


@dataclass
class Keep:
    """Which checkpoints a run keeps: ``count`` best by ``score`` (max), or the latest
    ``count`` when ``score`` is None; the latest always."""

    count: int
    score: str | None = None

    def kept(self, entries: list[dict]) -> list[dict]:
        if self.score is None:
            best = entries[-self.count :]
        else:
            score = self.score
            ranked = sorted(entries, key=lambda e: e["metrics"][score], reverse=True)
            best = ranked[: self.count]
        return [e for e in entries if e in best or e is entries[-1]]


class TaskSession:
    """A one-worker run's session: rank 0 of 1; checkpoints and their record on run storage."""

    def __init__(
        self,
        fs,
        run_path: str,
        name: str,
        keep: Keep,
        device: torch.device,
        on_report: Callable[[dict], None] | None = None,
    ) -> None:
        self.fs, self.run_path, self.name, self.keep = fs, run_path, name, keep
        self.path, self._device, self.on_report = f"{run_path}/{name}", device, on_report

    def rank_world(self) -> tuple[int, int]:
        return 0, 1

    def device(self) -> torch.device:
        return self._device

    def entries(self) -> list[dict]:
        return read_record(self.fs, self.path)

    def checkpoint(self) -> ray.train.Checkpoint | None:
        entries = self.entries()
        if not entries:
            return None
        return ray.train.Checkpoint(f"{self.path}/{entries[-1]['dir']}", filesystem=self.fs)

    def report(self, metrics: dict, directory: str) -> None:
        name = f"checkpoint_epoch{int(metrics['epoch']):04d}"
        storage.replace_dir(self.fs, directory, f"{self.path}/{name}")
        entries = [e for e in self.entries() if e["dir"] != name]
        entries.append({"dir": name, "metrics": metrics})
        kept = self.keep.kept(entries)
        storage.write_json(self.fs, f"{self.path}/{RECORD}", {"checkpoints": kept})
        for dropped in (e for e in entries if e not in kept):  # listed: this run's own
            self.fs.delete_dir(f"{self.path}/{dropped['dir']}")
        line = json.dumps({"step": self.name, **metrics}, default=float)
        storage.append_line(self.fs, f"{self.run_path}/{METRICS_FILE}", line)
        if self.on_report is not None:
            self.on_report(metrics)


def read_record(fs, path: str) -> list[dict]:
    record = storage.read_json(fs, f"{path}/{RECORD}")
    return record["checkpoints"] if record else []


def fit_in_task(
    loop, loop_config: dict, cfg, fs, run_path: str, name: str, keep: Keep, callbacks=()
):
    """Run ``loop(loop_config)`` as one task with one worker's resources, retried up to
    ``cfg.run.max_failures`` times, each report handed to every callback's ``task_report`` as
    it comes; the run's :class:`TaskResult`."""
    scaling = cfg.scaling
    task = ray.remote(train_task).options(
        num_cpus=scaling.cpus_per_worker,
        num_gpus=1 if scaling.use_gpu else 0,
        num_returns="streaming",  # one object per report
        max_retries=0,  # retried here, from the latest checkpoint
        # not inside a Tune trial's placement group: its bundle holds only the trial itself
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=None),
    )
    failures, reports = 0, Reports(fs, run_path, name, callbacks)
    while True:
        try:
            stream = task.remote(loop, loop_config, fs, run_path, name, keep, scaling.use_gpu)
            for report in stream:
                reports.hand(ray.get(report))
            break
        except ray.exceptions.RayError as error:  # the loop raised, or its process died
            reports.catch_up()
            cause = getattr(error, "cause", None) or error
            if isinstance(cause, NonFiniteError):  # never retried, said alone
                raise NonFiniteError(str(cause)) from None
            limit = cfg.run.max_failures
            if limit != -1 and failures >= limit:
                raise
            failures += 1
            log.warning(
                "%s: the training task failed (%s); retry %d of %s from the latest checkpoint",
                name,
                type(cause).__name__,
                failures,
                "unlimited" if limit == -1 else limit,
            )
    path = f"{run_path}/{name}"
    kept = [
        (ray.train.Checkpoint(f"{path}/{e['dir']}", filesystem=fs), e["metrics"])
        for e in read_record(fs, path)
    ]
    last = kept[-1] if kept else (None, None)
    return TaskResult(last[0], last[1], kept, path)


class Reports:
    """Hands a run's reports to ``callbacks`` (their ``task_report``) once each, in order: as
    the task yields them, and after a failed attempt those the task logged but did not yield
    (its process died first). A report is logged (``metrics.jsonl``) before it is yielded."""

    def __init__(self, fs, run_path: str, name: str, callbacks) -> None:
        self.fs, self.name, self.callbacks = fs, name, callbacks
        self.log = f"{run_path}/{METRICS_FILE}"
        self.handed = len(self.logged()) if callbacks else 0  # an earlier run's, already seen

    def logged(self) -> list[dict]:
        lines = (json.loads(line) for line in storage.read_lines(self.fs, self.log))
        return [line for line in lines if line.pop("step", None) == self.name]

    def hand(self, metrics: dict) -> None:
        for callback in self.callbacks:
            callback.task_report(metrics)
        self.handed += 1

    def catch_up(self) -> None:
        if self.callbacks:
            for metrics in self.logged()[self.handed :]:
                self.hand(metrics)


_END = object()


def train_task(loop, loop_config, fs, run_path, name, keep, use_gpu) -> Iterator[dict]:
    """The task: ``loop(loop_config)`` in a thread, yielding each report's metrics as the loop
    makes it; the loop's error is raised after the reports made before it."""
    device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
    reports: queue.Queue = queue.Queue()
    failure: list[BaseException] = []

    def run() -> None:
        run_session = TaskSession(fs, run_path, name, keep, device, on_report=reports.put)
        try:
            with session.using(run_session), console_lines():
                loop(loop_config)
        except BaseException as error:  # raised in the task's own thread, below
            failure.append(error)
        finally:
            reports.put(_END)

    thread = threading.Thread(target=run, name=f"raycompat-{name}", daemon=True)
    thread.start()
    while (metrics := reports.get()) is not _END:
        yield metrics
    thread.join()
    if failure:
        raise failure[0]


@contextlib.contextmanager
def console_lines() -> Iterator[None]:
    """The loop's ``raycompat`` lines (the epoch line) on this process's stderr, message only,
    as Ray Train's worker logging prints them (a task's process has no handler of its own);
    removed after, the process being pooled."""
    if logging.getLogger().handlers:  # someone configured this process's logging already
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("raycompat")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
