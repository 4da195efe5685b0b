"""The Ray runner of the sharded index build (raycompat/cluster/pipelines/index.py): what each
task reserves."""

from __future__ import annotations

from raycompat.cluster.pipelines.index import RayTasks


def test_tasks_reserve_their_share_and_the_k_means_task_what_it_asks_for():
    runner = RayTasks(workers=2, cpus_per_task=3)
    assert runner.task_options() == {"num_cpus": 3, "num_gpus": 0}  # sample, add, merge
    assert runner.task_options(cpus=16) == {"num_cpus": 16, "num_gpus": 0}  # k-means, no GPU
    assert runner.task_options(gpus=1) == {"num_cpus": 3, "num_gpus": 1}  # k-means on a GPU


def test_a_node_is_the_largest_live_node_of_the_cluster(ray_local):
    runner = RayTasks(workers=2)
    assert runner.node_cpus() == int(ray_local.cluster_resources()["CPU"]) == 4
    # the k-means task fits on it: a task reserving a whole node runs
    task = ray_local.remote(**runner.task_options(cpus=runner.node_cpus()))(lambda: 7)
    assert ray_local.get(task.remote(), timeout=60) == 7
