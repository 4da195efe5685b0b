"""Size a pipeline's actor pool from the cluster's nodes when the config says ``pool: auto``.

    plan_pool(RunOptions(pool="auto"), [{"CPU": 8}, {"CPU": 16, "GPU": 2}], chunks=500)
    -> RunOptions(actors=8, num_gpus_per_actor=0.25, threads_per_actor=1, pool="fixed", ...)

A transform spends its time in Parquet decode, checks and encode around a nearly free model
step (issue 38: h and g ran at 5.16M rows/s on an H200 while one reader/writer per GPU delivered
61k rows/s). So with GPUs each one is shared by ``k`` actors (``num_gpus_per_actor = 1/k``), as
many as the GPU nodes' CPUs allow (``CPUs per GPU // threads_per_actor``, at most
:data:`MAX_ACTORS_PER_GPU`: each holds a CUDA context); without GPUs there is one actor per
``threads_per_actor`` CPUs. Either way there are no more actors than chunks (an actor without a
chunk only costs its start-up). ``pool: fixed`` keeps ``actors`` and ``num_gpus_per_actor`` as
written. The resources are those of the nodes alive when the job starts (an autoscaling cluster
that has not started its GPU nodes yet gets a CPU pool). No Ray here: the caller passes the
nodes' resources (``ray.nodes()``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from raycompat.config.pipelines import RunOptions

# one per CPU of a 16-core GPU node (a CUDA context each, about 0.5 GB of the GPU's memory)
MAX_ACTORS_PER_GPU = 16


def plan_pool(run: RunOptions, nodes: Sequence[Mapping[str, float]], chunks: int) -> RunOptions:
    """``run`` with ``actors`` and ``num_gpus_per_actor`` derived from ``nodes`` (each node's
    resources, e.g. ``{"CPU": 16, "GPU": 2}``) when ``run.pool == "auto"``, else ``run``.

    The result is ``pool="fixed"``: sizing it again gives the same pool.
    """
    if run.pool != "auto":
        return run
    gpu_nodes = [n for n in nodes if n.get("GPU", 0) >= 1]
    if gpu_nodes:
        # one fraction for every GPU, so that each GPU node fits whole actors on its CPUs
        per_gpu = min(_actors_on(n, run.threads_per_actor) // int(n["GPU"]) for n in gpu_nodes)
        per_gpu = max(1, min(per_gpu, MAX_ACTORS_PER_GPU))
        actors = per_gpu * sum(int(n["GPU"]) for n in gpu_nodes)
        gpus = math.floor(10_000 / per_gpu) / 10_000  # Ray's resolution is 1e-4 of a unit
    else:
        actors, gpus = sum(_actors_on(n, run.threads_per_actor) for n in nodes), 0.0
    actors = max(1, min(actors, chunks))
    return dataclasses.replace(run, actors=actors, num_gpus_per_actor=gpus, pool="fixed")


def describe_nodes(nodes: Sequence[Mapping[str, float]], chunks: int) -> str:
    """``"2 node(s) (24.0 CPU, 2.0 GPU), 500 chunk(s)"``: what a pool was sized from, for the
    line that logs its sizes."""
    cpus = sum(n.get("CPU", 0) for n in nodes)
    gpus = sum(n.get("GPU", 0) for n in nodes)
    return f"{len(nodes)} node(s) ({cpus} CPU, {gpus} GPU), {chunks} chunk(s)"


def _actors_on(node: Mapping[str, float], threads_per_actor: int) -> int:
    return int(node.get("CPU", 0) // threads_per_actor)
