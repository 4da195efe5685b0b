"""The sharded index build on Ray: its tasks (sample, check, add, merge) as Ray tasks.

    from raycompat.cluster.pipelines.index import RayTasks
    build_version_index(store, "faces", "v3", runner=RayTasks(workers=8))   # kind="auto"

The build itself (plan, training, resume, publishing) is the core's
(:mod:`raycompat.index.sharded`); this runner, a :class:`raycompat.index.tasks.TaskRunner`,
only decides where its task functions run:
at most ``workers`` Ray tasks at a time, each reserving ``cpus_per_task`` CPUs and running faiss
with as many threads, except the k-means task, which reserves a whole node's CPUs
(:meth:`RayTasks.node_cpus`) or, when the cluster has one, a GPU. Results come back in call
order; the add phase logs its progress (rows done, rows/s, ETA) with
:class:`~raycompat.progress.Progress` as shards finish.
"""

from __future__ import annotations

import ray

from raycompat.cluster.pipelines.runner import PipelineError, _root_message, live_nodes
from raycompat.index.tasks import TaskRunner


class RayTasks(TaskRunner):
    """Runs the sharded build's task functions as Ray tasks.

    Args:
        workers: tasks in flight at once (each holds one shard's index in memory).
        cpus_per_task: CPUs each task reserves, and the faiss threads it uses.
        progress_every_s: seconds between progress lines of the add phase.
    """

    def __init__(
        self, workers: int = 2, cpus_per_task: int = 1, progress_every_s: float = 10.0
    ) -> None:
        if workers < 1 or cpus_per_task < 1:
            raise ValueError(
                f"workers and cpus_per_task must be >= 1, got {workers}, {cpus_per_task}"
            )
        self.workers, self.threads, self.progress_every_s = workers, cpus_per_task, progress_every_s

    def gpus_available(self) -> int:
        """GPUs in the Ray cluster: the k-means task asks for one when there is any."""
        return int(ray.cluster_resources().get("GPU", 0))

    def node_cpus(self) -> int:
        """CPUs of the cluster's largest live node: what the k-means task reserves (and the
        faiss threads it runs), so it is placed on a whole node."""
        cpus = [n.get("CPU", 0) for n in live_nodes()]
        return max(1, int(max(cpus, default=1)))

    def task_options(self, gpus: int = 0, cpus: int | None = None) -> dict:
        """The Ray resources of a call: ``cpus`` (None: ``cpus_per_task``) and ``gpus``."""
        return {"num_cpus": cpus or self.threads, "num_gpus": gpus}

    def completed(self, fn, calls, *, name, gpus, cpus):
        """Ray tasks, at most ``workers`` in flight, each reserving ``gpus`` GPUs and ``cpus``
        CPUs (:meth:`task_options`); yields each result as its task finishes.

        Raises:
            PipelineError: a task failed; the message is the task's own error line. The tasks
                still running are cancelled.
        """
        task = ray.remote(**self.task_options(gpus, cpus))(fn)
        running: dict = {}
        waiting = iter(enumerate(calls))
        try:
            while True:
                while len(running) < self.workers:
                    item = next(waiting, None)
                    if item is None:
                        break
                    running[task.remote(*item[1])] = item[0]
                if not running:
                    return
                [done], _ = ray.wait(list(running), num_returns=1)
                yield running.pop(done), ray.get(done)
        except ray.exceptions.RayError as error:
            for ref in running:
                ray.cancel(ref)
            raise PipelineError(f"{name} failed: {_root_message(error)}") from error
