"""Who runs a sharded index build's tasks: the :class:`TaskRunner` base, and its in-process
implementation :class:`LocalTasks`.

    build_version_index(store, "faces", "v3", kind="sharded_ivf")                  # LocalTasks
    from raycompat.cluster.pipelines.index import RayTasks                         # Ray layer
    build_version_index(store, "faces", "v3", kind="sharded_ivf", runner=RayTasks(workers=8))

The build (:mod:`raycompat.index.sharded`) plans and publishes on the driver; the task
functions (:mod:`raycompat.index.shard_tasks`: sample, train, check, add, merge) take picklable
arguments and open the store themselves, so any runner can place them:
in this process, as Ray tasks, or elsewhere. The index package never imports Ray.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from raycompat.index.gpu import gpu_available
from raycompat.progress import Progress

T = TypeVar("T")


class TaskRunner(ABC):
    """Runs a sharded build's task functions: :class:`LocalTasks` here, the Ray layer's
    ``RayTasks`` as Ray tasks. Each says how it runs a batch of calls (:meth:`completed`); the
    order of the results and the progress lines are this class's, once.

    Attributes:
        threads: faiss OpenMP threads each task uses (None: faiss' default).
        progress_every_s: seconds between two progress lines (0: a line per finished call).
    """

    threads: int | None = None
    progress_every_s: float = 0.0

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
        progress = None
        if rows is not None:
            progress = Progress(name, skipped + sum(rows), skipped, self.progress_every_s)
        results: list = [None] * len(calls)
        for k, result in self.completed(fn, calls, name=name, gpus=gpus, cpus=cpus):
            results[k] = result
            if progress is not None:
                progress.update(rows[k])
        return results

    @abstractmethod
    def completed(
        self,
        fn: Callable[..., T],
        calls: Sequence[tuple],
        *,
        name: str,
        gpus: int,
        cpus: int | None,
    ) -> Iterator[tuple[int, T]]:
        """``(k, fn(*calls[k]))`` for every call, in the order the calls finish."""

    @abstractmethod
    def gpus_available(self) -> int:
        """GPUs the runner can give a task (0: none; the build asks for at most one)."""


class LocalTasks(TaskRunner):
    """Runs the build's tasks one after another in this process (no Ray); ``gpus`` and ``cpus``
    are served by the process's own GPUs and CPUs."""

    def completed(self, fn, calls, *, name, gpus, cpus):
        for k, call in enumerate(calls):
            yield k, fn(*call)

    def gpus_available(self) -> int:
        """GPUs faiss sees in this process (0 or 1 counts as "none" or "some")."""
        return int(gpu_available())
