"""The per-worker skeleton shared by every training run (a Ray Train worker group, or one
task: :mod:`raycompat.cluster.train.session`): a scenario step's model
(:mod:`raycompat.cluster.train.loop`) and FCT's ``psi``, ``h`` and ``g``
(:mod:`raycompat.cluster.train.fct_loop`).

Read top to bottom: :func:`setup_worker` wraps the model and its optimizer in the configured
:mod:`raycompat.parallel` strategy; :func:`train_worker` resumes from the session's checkpoint,
then per epoch sets the learning rate (one schedule, :func:`raycompat.train.schedule.lr_at`:
per step at fractional epochs when the task knows its step count, else per epoch), steps every
batch under a :class:`~raycompat.engine.StepGuard`, has the task score the epoch, reports a
checkpoint and logs the epoch's console line (rank 0: a progress bar on a terminal, elsewhere
the first, at most one per 10 s and the last epoch's line, :mod:`.epoch_log`). A
:class:`WorkerTask` supplies only what differs: its batches, its loss, its metrics, its export.

Checkpoint layout (every run): ``train_state/`` (the strategy's state plus ``epoch`` and
``global_step``; checkpoints older than ``global_step`` resume at global step 0) and the task's
exported files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import ray.train
import torch

from raycompat.cluster.train import session
from raycompat.cluster.train.epoch_log import EpochClock, epoch_ticker, log_epoch
from raycompat.engine import StepGuard, mean_values, sync_every
from raycompat.io.run_storage import exists, touch
from raycompat.parallel import Prepared, create_strategy
from raycompat.train.schedule import lr_at, optimizer_factory
from raycompat.train.stopping import CAP, PLATEAU, Plateau

log = logging.getLogger(__name__)
TRAIN_STATE = "train_state"


@dataclass
class EpochTraining:
    """What one epoch of training did on this rank: steps, summed loss terms (on the device
    while it trains; floats after :meth:`finish`), the rows trained on (one array per step), the
    start time and the seconds spent training."""

    epoch: int
    began: float
    steps: int = 0
    sums: dict[str, torch.Tensor | float] = field(default_factory=dict)
    rows: list[np.ndarray] = field(default_factory=list)
    trained_s: float = 0.0
    last_lr: float | None = None

    def add(self, values: dict[str, torch.Tensor], rows: np.ndarray) -> None:
        for name, value in values.items():
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.steps += 1
        self.rows.append(rows)

    def finish(self) -> None:
        """Read the sums from the device (one synchronisation): floats from here on."""
        self.sums = mean_values(self.sums, 1)

    def trained_rows(self) -> int:
        return sum(map(len, self.rows))


class WorkerTask:
    """What one run trains. Subclasses set the attributes and override the methods they need.

    Attributes:
        name: ``<run.name>/<piece>``, the console line's name.
        epochs: epochs to train; 0: evaluate once, untrained (a given model).
        failure_step: the ``run.inject_failure.step`` that targets this run.
        checked: check features, loss terms and gradient norm for NaN/inf (and clip to
            ``optim.clip_grad_norm``) with the guard; False: the guard only counts steps.
        where: prefix of the guard's messages.
        plateau: the rule that ends the run before ``epochs`` on its metrics'
            ``selection_score`` (:mod:`raycompat.train.stopping`); None: every epoch runs.
    """

    name: str
    epochs: int
    failure_step: int = 0
    checked: bool = False
    where: str = ""
    plateau: Plateau | None = None

    def batches(self, epoch: int) -> tuple[Iterable[tuple[object, np.ndarray]], int | None]:
        """``((batch, rows) pairs, steps)``: ``steps`` known in advance puts the learning rate
        on a per-step schedule (fractional epochs), None on a per-epoch one."""
        raise NotImplementedError

    def begin_epoch(self, epoch: int) -> None:
        """Before the epoch's first step (train mode, frozen statistics)."""

    def loss(self, batch, poison: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss to step on, named scalar terms to average)`` of one batch; ``poison``: the
        ``nan`` failure hook wants this loss NaN."""
        raise NotImplementedError

    def epoch_metrics(self, trained: EpochTraining, guard: StepGuard) -> dict:
        """COLLECTIVE where it evaluates. The metrics the epoch reports (``epoch`` included);
        ``guard`` checks what it evaluates."""
        raise NotImplementedError

    def export(self, directory: str, state: dict, metrics: dict) -> None:
        """Rank 0: write the exported pieces of the full ``state`` into the checkpoint."""
        raise NotImplementedError

    def save_shard(self, directory: str, rank: int, trained: EpochTraining) -> None:
        """Every rank: files of its own (default: none)."""


def scaling_config(scaling) -> ray.train.ScalingConfig:
    """Ray Train's ScalingConfig from a run's ``scaling`` section (training and FCT runs)."""
    return ray.train.ScalingConfig(
        num_workers=scaling.num_workers,
        use_gpu=scaling.use_gpu,
        resources_per_worker={"CPU": scaling.cpus_per_worker},
        placement_strategy=scaling.placement_strategy,
    )


REPORT_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


@contextlib.contextmanager
def report_polling(run) -> Iterator[None]:
    """Around a ``trainer.fit()``: Ray Train's controller collects the workers' reports every
    ``run.report_poll_s`` seconds. Ray reads the interval from the driver's environment when
    ``fit`` starts its controller (and passes ``RAY_TRAIN_*`` variables on to it); the
    driver's environment is restored after."""
    before = os.environ.get(REPORT_POLL_ENV)
    os.environ[REPORT_POLL_ENV] = str(run.report_poll_s)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(REPORT_POLL_ENV, None)
        else:
            os.environ[REPORT_POLL_ENV] = before


def setup_worker(model: torch.nn.Module, cfg, channels_last: bool) -> tuple[Prepared, int, int]:
    """Wrap ``model`` and ``cfg.optim``'s optimizer in ``cfg.scaling``'s strategy; returns
    ``(prepared, rank, world)`` in the current session's run."""
    run = session.current()
    prepared = prepare_model(model, cfg, run.device(), channels_last)
    return (prepared, *run.rank_world())


def prepare_model(
    model: torch.nn.Module,
    cfg,
    device: torch.device,
    channels_last: bool = False,
    strategy: str | None = None,
) -> Prepared:
    """``model`` and ``cfg.optim``'s optimizer wrapped on ``device`` in ``strategy`` (default
    ``cfg.scaling``'s, with its options), at this worker's torch thread count. Shared by the
    training workers and the task that evaluates an untrained step (``evaluate.py``)."""
    torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))
    if device.type == "cuda":  # every batch has the same shape: let cuDNN pick its kernels once
        torch.backends.cudnn.benchmark = True
    name, options = strategy, {}
    if strategy is None:
        name, options = cfg.scaling.strategy, cfg.scaling.strategy_options
    return create_strategy(name, **options).setup(
        model,
        optimizer_factory(cfg.optim),
        device,
        precision=cfg.scaling.precision,
        channels_last=channels_last and device.type == "cuda",
    )


def resume(prepared: Prepared, name: str) -> dict:
    """The restored checkpoint's train state (``epoch``, ``global_step``, ``plateau``), or
    ``{"epoch": -1, "global_step": 0}`` for a fresh run. A resume is logged as the epoch lines
    name the run and count its epochs (from 1: state ``epoch`` 0 is ``epoch 1/N``)."""
    checkpoint = session.current().checkpoint()
    if checkpoint is None:
        return {"epoch": -1, "global_step": 0}
    with checkpoint.as_directory() as directory:
        state = prepared.load(os.path.join(directory, TRAIN_STATE))
    log.info("%s: resumed after epoch %d (its checkpoint)", name, state["epoch"] + 1)
    return state


def maybe_fail(cfg, index: int, epoch: int, batch: int, rank: int, marker) -> bool:
    """The ``run.inject_failure`` test hook (:class:`~raycompat.config.train.FailurePoint`):
    kind ``error`` raises once; returns True where kind ``nan`` wants this batch's loss NaN."""
    point = cfg.run.inject_failure
    if point is None or (point.step, point.epoch, point.batch, point.rank) != (
        index,
        epoch,
        batch,
        rank,
    ):
        return False
    fs, path = marker
    if point.kind == "nan":
        touch(fs, f"{path}_nan_{uuid.uuid4().hex}")  # one marker per hit: tests count attempts
        return True
    if not exists(fs, path):  # once per run: the marker survives the restart
        touch(fs, path)
        raise RuntimeError(f"injected failure at step {index} epoch {epoch} batch {batch}")
    return False


def train_worker(task: WorkerTask, prepared: Prepared, cfg, rank: int, marker) -> None:
    """Resume, then train, score, report and log every remaining epoch of ``task``, until its
    cap or (with a ``plateau`` rule) its validation plateau."""
    state = resume(prepared, task.name)
    first = state["epoch"] + 1
    if task.plateau is not None:
        task.plateau.restore(state.get("plateau"))
        if state.get("stopped") == PLATEAU:  # it had stopped before the restart
            return
    clip = cfg.optim.clip_grad_norm if task.checked else None
    guard = StepGuard(
        clip, state.get("global_step", 0), where=task.where, sync_every=sync_every(prepared.device)
    )
    clock = EpochClock(first, task.epochs)
    # rank 0's console: a bar on a terminal, else the first line, one per 10 s and the last
    with epoch_ticker(log, task.name, task.epochs - first, rank) as ticker:
        for epoch in range(first, max(task.epochs, 1)):  # 0 epochs: evaluated once, untrained
            trained = EpochTraining(epoch, time.perf_counter())
            if task.epochs:
                train_epoch(task, prepared, cfg, guard, trained, rank, marker)
            trained.finish()  # the epoch's one read of its loss sums
            trained.trained_s = time.perf_counter() - trained.began
            metrics = task.epoch_metrics(trained, guard)
            stop = stopping(task, epoch, metrics)  # the same on every rank: their metrics agree
            report(task, prepared, metrics, trained, rank, guard.global_step)
            if rank == 0 and task.epochs:  # the console's line (metrics.jsonl: every epoch)
                terms = {k: metrics[k] for k in trained.sums if k != "grad_norm"}
                if task.plateau is not None:  # the score the rule watches
                    terms["val"] = metrics["selection_score"]
                last = stop or epoch + 1 >= task.epochs
                log_epoch(ticker, task.name, epoch, task.epochs, terms, metrics, clock, last)
            if stop:
                if rank == 0:
                    log_converged(task, epoch)
                return


def log_converged(task: WorkerTask, epoch: int) -> None:
    """Rank 0's line of a run its plateau rule stopped after ``epoch``."""
    log.info(
        "%s: converged after epoch %d of a %d-epoch cap: the validation score has not "
        "improved for %d epochs (best %.4f at epoch %d, the one kept)",
        task.name,
        epoch + 1,
        task.epochs,
        task.plateau.patience,
        task.plateau.best,
        task.plateau.best_epoch + 1,
    )


def stopping(task: WorkerTask, epoch: int, metrics: dict) -> bool:
    """Whether the run ends after ``epoch``; adds the stopping rule's record to ``metrics``:
    ``epochs_cap``, ``epochs_run``, ``stopped`` (``cap``/``plateau``, on the last epoch
    only) and the plateau's ``best_epoch`` and ``best_score``."""
    metrics.update(epochs_cap=task.epochs, epochs_run=epoch + 1)
    stop = False
    if task.plateau is not None and task.epochs:
        plateau = task.plateau.update(epoch, float(metrics["selection_score"]))
        stop = plateau and epoch + 1 < task.epochs  # at the cap, the cap ended it
        metrics.update(best_epoch=task.plateau.best_epoch, best_score=task.plateau.best)
    if stop:
        metrics["stopped"] = PLATEAU
    elif epoch + 1 >= task.epochs:
        metrics["stopped"] = CAP
    return stop


def train_epoch(task, prepared, cfg, guard: StepGuard, trained: EpochTraining, rank, marker):
    """One pass over the task's batches: lr, failure hook, loss, guarded backward and step;
    fills ``trained``."""
    epoch = trained.epoch
    batches, steps = task.batches(epoch)
    if steps is None:
        trained.last_lr = lr_at(cfg.optim, epoch, task.epochs)
        prepared.set_lr(trained.last_lr)
    task.begin_epoch(epoch)
    # A torch optimizer steps after the guard's gradient check; DeepSpeed's engine owns its step
    # (and clips with strategy_options.gradient_clipping).
    optimizer = prepared.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = None
    watching = guard.watch(prepared.model, optimizer) if task.checked else contextlib.nullcontext()
    with watching:
        for batch, rows in guard.steps(batches, epoch):
            poison = maybe_fail(cfg, task.failure_step, epoch, guard.step, rank, marker)
            if steps is not None:
                trained.last_lr = lr_at(cfg.optim, epoch + guard.step / steps, task.epochs)
                prepared.set_lr(trained.last_lr)
            loss, terms = task.loss(batch, poison)
            if task.checked:
                values = guard.watch_terms(terms)
            else:
                values = {name: value.detach().float() for name, value in terms.items()}
            prepared.backward_step(loss)  # the guard checks the gradient norm
            if task.checked and optimizer is not None:
                values["grad_norm"] = guard.grad_norm
            trained.add(values, rows)


def report(task, prepared, metrics: dict, trained: EpochTraining, rank: int, global_step: int):
    """COLLECTIVE. Save the strategy state, export the pieces on rank 0, report the checkpoint."""
    directory = tempfile.mkdtemp(prefix=f"raycompat-rank{rank}-")
    train_state = {"epoch": metrics["epoch"], "global_step": global_step}
    if "best_epoch" in metrics:  # the stopping rule's state, for a resumed run
        train_state["plateau"] = {
            "best": metrics["best_score"],
            "best_epoch": metrics["best_epoch"],
        }
    if "stopped" in metrics:
        train_state["stopped"] = metrics["stopped"]
    prepared.save(os.path.join(directory, TRAIN_STATE), train_state)
    state = prepared.full_state_dict()
    task.save_shard(directory, rank, trained)
    if rank == 0:
        task.export(directory, state, metrics)
    session.current().report(metrics, directory)
    shutil.rmtree(directory, ignore_errors=True)
