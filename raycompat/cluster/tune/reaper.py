"""Give back the CPUs of a trial that a Tune scheduler stops in the middle of training.

When ASHA stops a trial, Tune kills the trial's actor. The Ray Train controller that the trial's
``trainer.fit()`` started is owned by that actor and dies with it, and the training workers die
with the controller. Their placement group does not: a group created by an ordinary actor lives
as long as the Ray job (the sweep). Ray 2.58's own ``PlacementGroupCleaner`` watches the
controller through the State API, which needs the Ray dashboard; without it the cleaner retries
forever (ray-project/ray#54305), and on a small cluster the held CPUs starve every later trial.

:class:`PlacementGroupReaper` is a Ray Train callback that does the same job without the State
API: a detached watcher actor holds a handle to the controller, pings it, and removes the worker
group's placement group once the controller is dead. A run that shuts down normally releases
the watcher first, so the watcher never touches a group the controller removed itself.
"""

from __future__ import annotations

import logging
import threading
import time

import ray
from ray.exceptions import RayActorError
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

log = logging.getLogger(__name__)


class ControllerWatch:
    """Detached actor: removes the guarded placement group once ``controller`` is dead, then
    ends itself.

    Liveness is a ping to the controller's built-in ``__ray_ready__``: a dead actor answers it
    with ``RayActorError``; while a ping waits for its answer the controller counts as alive.
    """

    def __init__(self, controller, interval_s: float = 1.0) -> None:
        self._controller = controller
        self._interval_s = interval_s
        self._group: PlacementGroup | None = None
        threading.Thread(target=self._watch, name="raycompat-pg-reaper", daemon=True).start()

    def guard(self, group: PlacementGroup) -> None:
        """The placement group to remove if the controller dies (the latest worker group's)."""
        self._group = group

    def _watch(self) -> None:
        while True:
            try:
                ray.get(self._controller.__ray_ready__.remote())
            except RayActorError:
                break
            time.sleep(self._interval_s)
        group = self._group
        if group is not None and placement_group_table(group).get("state") != "REMOVED":
            log.warning(
                "the Ray Train controller is gone (its trial was stopped): removing its "
                "worker placement group %s",
                group.id.hex(),
            )
            remove_placement_group(group)
        ray.kill(ray.get_runtime_context().current_actor)


class PlacementGroupReaper(ControllerCallback, WorkerGroupCallback):
    """Ray Train callback (runs in the controller) that starts a :class:`ControllerWatch` and
    hands it each worker group's placement group; see the module docstring."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._watch = None

    def after_controller_start(self, train_run_context) -> None:
        controller = ray.get_runtime_context().current_actor
        # DEFAULT scheduling: outside the trial's placement group, which Tune removes (killing
        # every actor in it) when it stops the trial.
        self._watch = (
            ray.remote(num_cpus=0)(ControllerWatch)
            .options(lifetime="detached", scheduling_strategy="DEFAULT")
            .remote(controller, self.interval_s)
        )

    def after_worker_group_start(self, worker_group) -> None:
        group = worker_group.get_worker_group_state().placement_group_handle.placement_group
        ray.get(self._watch.guard.remote(group))

    async def before_controller_shutdown(self) -> None:
        self._release()

    def before_controller_abort(self) -> None:
        self._release()

    def task_report(self, metrics: dict) -> None:
        """A one-worker step trained in a task holds no placement group of its own: the trial's
        actor owns the task, and Ray ends the task when a scheduler kills that actor."""

    def _release(self) -> None:
        """A normal shutdown or abort: the controller removes its own group; end the watcher."""
        if self._watch is not None:
            ray.kill(self._watch)
            self._watch = None
