"""The task-runner protocol of the sharded index build (raycompat/index/tasks.py)."""

from __future__ import annotations

from raycompat.index import sharded
from raycompat.index.tasks import LocalTasks, TaskRunner


def test_local_tasks_is_a_task_runner_and_keeps_its_old_import_path():
    assert isinstance(LocalTasks(), TaskRunner)
    assert sharded.LocalTasks is LocalTasks
    runner = LocalTasks()
    assert runner.map(pow, [(2, 3), (3, 2)], name="pow", rows=[1, 1]) == [8, 9]


def test_ray_tasks_is_a_task_runner():
    from raycompat.cluster.pipelines.index import RayTasks

    assert isinstance(RayTasks(workers=1), TaskRunner)


def test_an_object_without_map_is_not_a_task_runner():
    class GpusOnly:
        threads = None

        def gpus_available(self):
            return 0

    assert not isinstance(GpusOnly(), TaskRunner)
