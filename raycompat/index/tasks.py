"""Who runs a sharded index build's tasks: the :class:`TaskRunner` protocol, and its in-process
implementation :class:`LocalTasks`.

    build_version_index(store, "faces", "v3", kind="sharded_ivf")                  # LocalTasks
    from raycompat.cluster.pipelines.index import RayTasks                         # Ray layer
    build_version_index(store, "faces", "v3", kind="sharded_ivf", runner=RayTasks(workers=8))

The build (:mod:`raycompat.index.sharded`) plans and publishes on the driver; the task
functions (:mod:`raycompat.index.shard_tasks`: sample, train, check, add, merge) take picklable
arguments and open the store themselves, so any runner satisfying the protocol can place them:
in this process, as Ray tasks, or elsewhere. The index package never imports Ray.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from raycompat.index.gpu import gpu_available

logger = logging.getLogger(__name__)
T = TypeVar("T")


@runtime_checkable
class TaskRunner(Protocol):
    """Runs a sharded build's task functions; ``LocalTasks`` and the Ray layer's ``RayTasks``
    satisfy it.

    Attributes:
        threads: faiss OpenMP threads each task uses (None: faiss' default). Optional: the build
            reads it with ``getattr(runner, "threads", None)``.
    """

    threads: int | None

    def map(
        self,
        fn: Callable[..., T],
        calls: Sequence[tuple],
        *,
        name: str,
        rows: Sequence[int] | None = None,
        skipped: int = 0,
        gpus: int = 0,
        cpus: int | None = None,
    ) -> list[T]:
        """``[fn(*call) for call in calls]``, results in call order, wherever the runner puts
        each call. ``name`` labels log lines and errors; with ``rows`` (rows of each call)
        progress is logged, ``skipped`` rows counting as done by an earlier run; ``gpus``: GPUs
        each call needs (the k-means task asks for one); ``cpus``: CPUs each call reserves
        (None: the runner's per-task share; the k-means task asks for a whole node's,
        ``node_cpus()``, when the runner has that method). A failed call raises."""
        ...

    def gpus_available(self) -> int:
        """GPUs the runner can give a task (0: none; the build asks for at most one)."""
        ...


class LocalTasks:
    """Runs the build's tasks one after another in this process (no Ray). The Ray layer's
    ``raycompat.cluster.pipelines.index.RayTasks`` runs them as Ray tasks; both are
    :class:`TaskRunner`\\ s."""

    threads: int | None = None

    def map(
        self,
        fn: Callable[..., T],
        calls: Sequence[tuple],
        *,
        name: str,
        rows: Sequence[int] | None = None,
        skipped: int = 0,
        gpus: int = 0,
        cpus: int | None = None,
    ) -> list[T]:
        """``[fn(*call) for call in calls]``; with ``rows`` (rows of each call), progress is
        logged per call, ``skipped`` rows counting as done by an earlier run. ``gpus``,
        ``cpus``: what a call needs; here the process's own GPUs and CPUs serve it."""
        out, done, total = [], skipped, skipped + sum(rows or ())
        for k, call in enumerate(calls):
            out.append(fn(*call))
            if rows is not None:
                done += rows[k]
                logger.info("%s: %d / %d rows (%d from an earlier run)", name, done, total, skipped)
        return out

    def gpus_available(self) -> int:
        """GPUs faiss sees in this process (0 or 1 counts as "none" or "some")."""
        return int(gpu_available())
