"""Run chunks through a pool of model actors with Ray Data, then publish the staged version.

    chunks (one row each) -> [map_batches(stage, TaskPoolStrategy(size=N), num_cpus=1): CPU
                              tasks in front, e.g. extraction's decoding]
                          -> map_batches(Worker, compute=ActorPoolStrategy, batch_size=1)
                          -> one output part file per chunk, written by the actor
                          -> driver: progress and the part records from the (tiny) result
                             rows -> Staging.commit of exactly those parts

Why the actors write the parts themselves rather than ``read_parquet -> map_batches ->
write_parquet``: resuming needs each output file to be a deterministic function of its input
chunk (``resume.py``), which Ray Data's writers do not offer (their file names and block
boundaries depend on the run). Each actor streams its chunk batch by batch, so memory is
bounded by ``actors x batch_size`` rows whatever the table size, and the model is loaded once
per actor, never per batch. A stage in front (extraction's decode workers, ``decode.py``) maps
each chunk's row to one row holding the chunk's inputs (its decoded images): still one chunk
per block, so the actor that gets it writes the whole part.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import pyarrow as pa
import ray
import torch

from raycompat.cluster.pipelines.parts import Chunk, PartWriter
from raycompat.cluster.pipelines.resume import pending_chunks, record_plan
from raycompat.cluster.pipelines.unique import check_unique_distributed
from raycompat.cluster.which_ray import announce, resolve_address
from raycompat.config.pipelines import RunOptions
from raycompat.errors import DataError
from raycompat.precision import autocast_dtype
from raycompat.progress import Progress
from raycompat.store import GalleryStore, Staging, StoreError, VersionInfo
from raycompat.store.commit.lease import LeaseRef
from raycompat.store.commit.part_record import IdFingerprint, PartRecord
from raycompat.store.commit.publish import with_operation

logger = logging.getLogger(__name__)


class PipelineError(DataError, RuntimeError):
    """A chunk failed in an actor; the message carries the actor's error (file, row...)."""


DISTRIBUTED_UNIQUE_ROWS = 1_000_000


@dataclass(frozen=True)
class Stage:
    """A CPU stage in front of the model actors: ``fn(batch, **kwargs)`` in Ray tasks of 1 CPU,
    ``workers`` at a time, maps each chunk's row to one row: ``chunk`` plus the chunk's inputs.
    Tasks, not actors: their worker processes are reused, so a second pipeline in the same
    session starts with its imports done, and a failed chunk is not retried."""

    fn: Callable[..., dict]
    kwargs: dict
    workers: int


class ChunkWorker:
    """Stateful ``map_batches`` callable: one chunk in, one part file out, one result row back.

    Subclasses load their model once in ``__init__`` and implement :meth:`fill`, which gets the
    chunk's other columns (those a :class:`Stage` in front added) as keyword arguments.
    """

    def __init__(
        self,
        *,
        root: str,
        storage_options: dict,
        gallery: str,
        info: VersionInfo,
        staging_name: str,
        schema: pa.Schema,
        run: RunOptions,
        lease: LeaseRef,
    ) -> None:
        torch.set_num_threads(run.threads_per_actor)
        self.store = GalleryStore(root, storage_options)
        # Not store.begin(): the driver holds the lease; actors only check it (and that the
        # version is unpublished) before publishing each part.
        gallery_path = self.store.path(gallery)
        self.staging = Staging(self.store.backend, gallery_path, info, staging_name, lease)
        self.schema, self.run = schema, run
        self.device = torch.device("cuda" if run.num_gpus_per_actor > 0 else "cpu")
        self.autocast = autocast_dtype(run.precision, self.device)

    def fill(self, chunk: Chunk, writer: PartWriter, **inputs) -> None:
        raise NotImplementedError

    def __call__(self, batch: dict) -> dict:
        results = {"part": [], "rows": [], "record": [], "cpu_s": []}
        for row, item in enumerate(batch["chunk"]):
            start_cpu = time.process_time()
            chunk = Chunk(**json.loads(item))
            inputs = {name: column[row] for name, column in batch.items() if name != "chunk"}
            writer = PartWriter(self.staging, chunk.part, self.schema)
            try:
                self.fill(chunk, writer, **inputs)
            except BaseException:
                writer.abort()
                raise
            if writer.rows != chunk.rows:
                writer.abort()
                raise StoreError(
                    f"{writer.source}: wrote {writer.rows} rows, the chunk has {chunk.rows}"
                )
            record = writer.close()
            results["part"].append(chunk.part)
            results["rows"].append(chunk.rows)
            results["record"].append(record.to_json().decode())
            # this process's CPU (every thread: torch, Arrow, Ray's own) on the chunk
            results["cpu_s"].append(time.process_time() - start_cpu)
        return results


def chunk_worker_kwargs(
    store: GalleryStore, gallery: str, staging: Staging, schema: pa.Schema
) -> dict:
    """The :class:`ChunkWorker` constructor's arguments that every pool over ``staging``
    shares (all but ``run``, which :func:`run_chunks` adds): where the store and the staging
    area are, the output ``schema`` and the driver's lease, which actors check."""
    return dict(
        root=store.root,
        storage_options=store.storage_options,
        gallery=gallery,
        info=staging.info,
        staging_name=staging.path.rsplit("/", 1)[1],
        schema=schema,
        lease=staging.lease_ref,
    )


def chunk_dataset(
    chunks: list[Chunk],
    worker: type[ChunkWorker],
    worker_kwargs: dict,
    run: RunOptions,
    before: Stage | None = None,
) -> ray.data.Dataset:
    """The (lazy) Ray Data pipeline of :func:`run_chunks`: one result row per chunk.

    The ``before`` stage's tasks are never fused into the model actors (Ray Data fuses a task
    map into a following actor map when their remote arguments agree; these differ in
    ``max_retries`` / ``max_restarts``), so the decoding runs in its own processes:
    ``tests/cluster/pipelines/test_extract_pipeline.py`` checks the physical plan.
    """
    items = [{"chunk": json.dumps(asdict(c))} for c in chunks]
    actors = min(run.actors, len(chunks))
    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    if before is not None:
        dataset = dataset.map_batches(
            before.fn,
            fn_kwargs=before.kwargs,
            batch_size=1,
            compute=ray.data.TaskPoolStrategy(size=min(before.workers, len(chunks))),
            num_cpus=1,
            max_retries=0,  # an error in a chunk (a corrupt image) fails the run at once
        )
    dataset = dataset.map_batches(
        worker,
        fn_constructor_kwargs={**worker_kwargs, "run": run},
        batch_size=1,
        # A fixed pool, every actor started at once (an autoscaling pool grows only after its
        # first actor has loaded its model: seconds of one actor working alone). Fixed,
        # because a few chunks in flight per actor are below Ray Data's threshold for growing
        # a pool (it warns "will not allow it to scale up"). Chunks in flight per actor:
        # :func:`chunks_in_flight`.
        compute=ray.data.ActorPoolStrategy(
            size=actors, max_tasks_in_flight_per_actor=chunks_in_flight(len(chunks), actors, before)
        ),
        # Not restartable: Ray Data hands its actors their constructor arguments in the object
        # store, which a restart cannot rely on (ray-project/ray#53727; Ray core logs an ERROR
        # for every such restartable actor). An actor that dies fails the run, and the rerun
        # resumes from the parts already written (resume.py).
        max_restarts=0,
        num_cpus=run.threads_per_actor,
        num_gpus=run.num_gpus_per_actor or None,
    )
    return dataset


def chunks_in_flight(chunks: int, actors: int, before: Stage | None) -> int:
    """How many chunks each actor is handed at a time: two, so that the next chunk is waiting
    in the actor when it finishes one (one at a time, each actor idled 160-170 ms between its
    chunks while Ray Data handed it the next: 20% of a 100k-row transform chunk on 2 CPUs,
    ``benchmarks/README.md``, "Transform pipeline"); and behind a stage the next block
    reaches the actor while it embeds this one. One only when there are fewer than four
    chunks per actor: then a chunk queued behind a busy actor would leave another idle at the
    end for longer than the gaps cost."""
    if before is None and chunks < 4 * actors:
        return 1
    return 2


def live_nodes() -> list[dict]:
    """The resources of the cluster's live nodes (``{"CPU": 16, "GPU": 2}`` each): what a pool
    is sized from (``pool.py``, ``decode.plan_pools``). A library call made with no Ray yet
    (a notebook's ``transform_version``) starts one by the jobs' rule (``which_ray``): the
    cluster ``RAY_ADDRESS`` names, else a private one, never Ray's "latest cluster" on the
    machine."""
    if not ray.is_initialized():
        address = resolve_address(None)
        ray.init(address=address, include_dashboard=False)  # as the jobs' (init_ray)
        announce(address)
    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def run_chunks(
    chunks: list[Chunk],
    worker: type[ChunkWorker],
    worker_kwargs: dict,
    run: RunOptions,
    progress: Progress,
    staging: Staging | None = None,
    before: Stage | None = None,
) -> float:
    """Process ``chunks`` in an actor pool, behind the ``before`` stage if given; raise
    :class:`PipelineError` if any chunk fails (in either pool).
    The part records the actors return are added to ``staging``'s list of parts (the driver's
    own list, which its commit publishes). Returns the CPU seconds the model actors spent on
    the chunks (their start-up, imports and model loading excluded, and the ``before`` stage's
    CPU; 0 for workers not reporting it).
    """
    if not chunks:
        return 0.0
    dataset = chunk_dataset(chunks, worker, worker_kwargs, run, before)
    cpu_s = 0.0
    try:
        for row in dataset.iter_rows():
            if staging is not None:
                staging.add_part(PartRecord.from_json(row["record"], staging.uri))
            progress.update(int(row["rows"]))
            cpu_s += float(row["cpu_s"]) if "cpu_s" in row else 0.0
    except Exception as error:  # Ray wraps the actor's error; keep its message, drop the noise
        raise PipelineError(f"{progress.name} failed: {_root_message(error)}") from error
    finally:
        # Ray Data frees a pool's actors when their handles are dropped (it does not kill
        # them), and now and then a handle is left in a reference cycle: the actor kept its
        # CPU (on a GPU node, its GPU) until Python's next full collection, and a task that
        # needs the whole node next (the index's k-means) waited for it.
        del dataset
        gc.collect()
    return cpu_s


def run_staged(
    store: GalleryStore,
    gallery: str,
    staging: Staging,
    *,
    name: str,
    identity: dict,
    chunks: list[Chunk],
    worker: type[ChunkWorker],
    worker_kwargs: dict,
    schema: pa.Schema,
    run: RunOptions,
    verify: Callable[[Staging], None] | None,
    check: str = "rows",
    expected_ids: IdFingerprint | None = None,
    distributed_unique: bool = False,
    before: Stage | None = None,
) -> dict:
    """Plan (or resume), run the pending chunks, verify, and publish; the job's shared tail.

    ``before``: a stage in front of the actors (:func:`run_chunks`).
    ``check`` and ``expected_ids`` go to ``Staging.commit``; ``distributed_unique`` first
    checks the staged ids unique with Ray Data (``unique.py``). On any failure the staging area's
    lease is released (its finished parts stay), so that a rerun resumes at once instead of
    waiting for the lease to time out.
    Returns the progress summary plus ``"actor_cpu_s"`` (the actors' CPU seconds on this run's
    chunks, ``run_chunks``) and ``"version"``, the published record.
    """
    try:
        record_plan(staging, identity, chunks)
        todo = pending_chunks(staging, chunks)
        total = sum(c.rows for c in chunks)
        progress = Progress(name, total, total - sum(c.rows for c in todo), run.progress_every_s)
        kwargs = {**chunk_worker_kwargs(store, gallery, staging, schema), **worker_kwargs}
        # positional: tests swap run_chunks for a wrapper taking (chunks, worker, *args)
        actor_cpu_s = run_chunks(todo, worker, kwargs, run, progress, staging, before)
        if verify is not None:  # the caller's quality gate: raising here publishes nothing
            verify(staging)
        if distributed_unique:
            check_unique_distributed(staging, staging.files())
        staging.info = with_operation(staging.info, **identity)  # history's operation
        info = staging.commit(expected_rows=total, expected_ids=expected_ids, check=check)
    except BaseException:
        staging.release()
        raise
    return {**progress.summary(), "actor_cpu_s": actor_cpu_s, "version": info}


_ERROR_LINE = re.compile(r"^([\w.]*(?:Error|Exception)): (.+)$")


def _root_message(error: BaseException) -> str:
    """The error line the worker raised (e.g. ``SchemaError: <file>: row 17 ...``).

    Ray Data re-raises a UDF failure as ``UserCodeException`` whose text holds the worker's
    traceback, causes first (``raise CorruptDataError(...) from OSError(...)`` shows the
    ``OSError`` line, then the ``CorruptDataError`` one): the last ``<Type>Error: message`` line
    in it that is not Ray's is the error raised.
    """
    lines = [_ERROR_LINE.match(line.strip()) for line in str(error).splitlines()]
    ours = [m.group(0) for m in lines if m and not m.group(1).startswith("ray.")]
    if ours:
        return ours[-1]
    return str(error).strip().splitlines()[-1] if str(error).strip() else repr(error)
