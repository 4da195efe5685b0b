"""Pool sizes derived from the cluster's nodes (``pool.py``): several actors share each GPU as
far as the GPU nodes' CPUs allow, one actor per CPU budget without GPUs, never more actors than
chunks, and a fixed pool kept as written."""

from __future__ import annotations

import dataclasses

import pytest

from raycompat.cluster.pipelines.pool import MAX_ACTORS_PER_GPU, describe_nodes, plan_pool
from raycompat.config.pipelines import RunOptions

AUTO = RunOptions(pool="auto")


def test_a_fixed_pool_is_kept_as_written():
    run = RunOptions(actors=3, num_gpus_per_actor=1.0)
    assert plan_pool(run, [{"CPU": 64, "GPU": 8}], chunks=100) is run


@pytest.mark.parametrize(
    ("nodes", "chunks", "actors"),
    [
        ([{"CPU": 2}], 100, 2),
        ([{"CPU": 2}], 1, 1),  # never more actors than chunks
        ([{"CPU": 4}, {"CPU": 16, "memory": 1e9}], 100, 20),  # every node's CPUs
        ([{"CPU": 0.5}], 100, 1),  # at least one actor
    ],
)
def test_without_gpus_one_actor_per_cpu_budget(nodes, chunks, actors):
    sized = plan_pool(AUTO, nodes, chunks)
    assert (sized.actors, sized.num_gpus_per_actor, sized.pool) == (actors, 0.0, "fixed")


def test_threads_per_actor_divide_the_cpus():
    sized = plan_pool(dataclasses.replace(AUTO, threads_per_actor=3), [{"CPU": 16}], 100)
    assert sized.actors == 5 and sized.threads_per_actor == 3


@pytest.mark.parametrize(
    ("nodes", "actors", "gpus"),
    [
        ([{"CPU": 16, "GPU": 1}], 16, 0.0625),  # the H200 node: one actor per core
        ([{"CPU": 96, "GPU": 1}], MAX_ACTORS_PER_GPU, 1 / MAX_ACTORS_PER_GPU),  # capped
        ([{"CPU": 4, "GPU": 1}], 4, 0.25),  # as many as the node's CPUs allow
        ([{"CPU": 3, "GPU": 1}], 3, 0.3333),  # Ray's 1e-4 resolution, rounded down
        ([{"CPU": 1, "GPU": 2}], 2, 1.0),  # at least one actor per GPU
        # a CPU-only head does not count; the smallest CPUs-per-GPU node sets the fraction
        ([{"CPU": 8}, {"CPU": 8, "GPU": 2}, {"CPU": 32, "GPU": 4}], 24, 0.25),
    ],
)
def test_with_gpus_several_actors_share_each_gpu(nodes, actors, gpus):
    sized = plan_pool(AUTO, nodes, chunks=1000)
    assert sized.actors == actors
    assert sized.num_gpus_per_actor == pytest.approx(gpus, abs=1e-9)
    assert sized.num_gpus_per_actor * (actors // sum(n.get("GPU", 0) for n in nodes)) <= 1.0


def test_a_gpu_pool_is_capped_at_the_chunks_and_sizing_again_keeps_it():
    sized = plan_pool(AUTO, [{"CPU": 16, "GPU": 1}], chunks=3)
    assert (sized.actors, sized.num_gpus_per_actor) == (3, 0.0625)
    assert plan_pool(sized, [{"CPU": 2}], chunks=100) is sized


def test_describe_nodes_names_what_a_pool_was_sized_from():
    nodes = [{"CPU": 8.0}, {"CPU": 16.0, "GPU": 2.0}]
    assert describe_nodes(nodes, 500) == "2 node(s) (24.0 CPU, 2.0 GPU), 500 chunk(s)"


@pytest.mark.parametrize(
    ("chunks", "actors", "staged", "in_flight"),
    [
        (40, 2, False, 2),  # the next chunk waits in the actor: no gap between chunks
        (8, 2, False, 2),
        (7, 2, False, 1),  # under four chunks an actor: a queued one would idle another
        (3, 2, True, 2),  # behind a stage always two: the next block arrives while it embeds
    ],
)
def test_chunks_in_flight_per_actor(chunks, actors, staged, in_flight):
    from raycompat.cluster.pipelines.runner import Stage, chunks_in_flight

    before = Stage(fn=dict, kwargs={}, workers=1) if staged else None
    assert chunks_in_flight(chunks, actors, before) == in_flight
