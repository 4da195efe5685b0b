"""What a training worker asks of the run it is in: its rank and world, its device, the
checkpoint to resume from, and where to report an epoch.

Two runs answer: Ray Train's worker group (:class:`RayTrainSession`, the default) and one Ray
task (:class:`~raycompat.cluster.train.task_run.TaskSession`, a run of one worker; see
:mod:`raycompat.cluster.train.task_run`). The worker skeleton
(:mod:`raycompat.cluster.train.worker`) and the loops ask :func:`current`; the task runner
installs its own session with :func:`using` around the loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import ray.train
import ray.train.torch
import torch


class Session(Protocol):
    def rank_world(self) -> tuple[int, int]:
        """``(this worker's rank, number of workers)``."""

    def device(self) -> torch.device: ...

    def checkpoint(self) -> ray.train.Checkpoint | None:
        """The checkpoint to resume from: the run's latest, or None."""

    def report(self, metrics: dict, directory: str) -> None:
        """COLLECTIVE. Record an epoch's ``metrics`` and its checkpoint folder ``directory``
        (the caller deletes the folder after)."""


class RayTrainSession:
    """Ray Train's: the worker group's context, checkpoints and reports."""

    def rank_world(self) -> tuple[int, int]:
        ctx = ray.train.get_context()
        return ctx.get_world_rank(), ctx.get_world_size()

    def device(self) -> torch.device:
        return ray.train.torch.get_device()

    def checkpoint(self) -> ray.train.Checkpoint | None:
        return ray.train.get_checkpoint()

    def report(self, metrics: dict, directory: str) -> None:
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


_current: Session | None = None


def current() -> Session:
    """The session of the run this process trains in (Ray Train's unless :func:`using` set
    another)."""
    return _current if _current is not None else RayTrainSession()


@contextlib.contextmanager
def using(session: Session) -> Iterator[Session]:
    """Make ``session`` this process's :func:`current` session for the block."""
    global _current
    before, _current = _current, session
    try:
        yield session
    finally:
        _current = before
