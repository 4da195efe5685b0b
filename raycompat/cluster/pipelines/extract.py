"""Extraction: images -> decode workers (CPU) -> model actors -> a new gallery version.

    extract_version(store, "faces", VersionInfo("v1", "resnet50-e90", 512, True,
                    "v1 = extract(resnet50-e90)"), "runs/step1/model",
                    SourceSpec(kind="dataset", name="casia_webface", options={"root": ...}))

The backfill baseline and the initial index, as Ray Data's batch inference: one pipeline over
the chunk descriptors, ``map_batches(decode_chunks)`` in CPU tasks (each worker process opens the
image source once, decodes and augments a chunk into one block: ``decode.py``) in front of
``map_batches(ExtractChunks)`` on the model actors (GPU when configured), which embed each
block in batches of ``run.batch_size`` (``forward_features``, bf16 autocast on GPU by default),
L2-normalise if the version is ``normalized`` and write the chunk's part. The pipeline streams:
decoders work ahead of the model, as far as Ray Data's object-store budget allows. Both pool
sizes come from the cluster's resources unless the config sets them (``decode.plan_pools``).
The driver reads the exported model (``model.safetensors`` + ``model.json``) once and puts it
in Ray's object store (``weights.py``). Same resumable protocol and publishing as
:mod:`raycompat.cluster.pipelines.transform`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from raycompat import engine
from raycompat.cluster.pipelines.decode import (
    Pools,
    chunk_rows,
    decode_chunks,
    decode_rows,
    plan_pools,
)
from raycompat.cluster.pipelines.host_copy import HostCopy, copy_to_host
from raycompat.cluster.pipelines.inputs import file_digest
from raycompat.cluster.pipelines.parts import Chunk, PartWriter
from raycompat.cluster.pipelines.pool import describe_nodes
from raycompat.cluster.pipelines.runner import (
    DISTRIBUTED_UNIQUE_ROWS,
    ChunkWorker,
    Stage,
    live_nodes,
    run_staged,
)
from raycompat.cluster.pipelines.sources import SourceSpec, open_source
from raycompat.cluster.pipelines.weights import Shared, model_of, share_model
from raycompat.config.pipelines import RunOptions
from raycompat.data.augment import AUGMENTATIONS
from raycompat.data.base import as_float_images
from raycompat.store import (
    GalleryStore,
    SchemaError,
    VersionInfo,
    embedding_schema,
    embedding_table,
)
from raycompat.store.commit.staging import Staging
from raycompat.train.export import MODEL_FILE, build_model, read_spec

logger = logging.getLogger(__name__)

# Batches the backfill's re-extraction decodes ahead of its model (``backfill.py``): one queued
# plus one being decoded
PREFETCH_BATCHES = 1


class ExtractChunks(ChunkWorker):
    """Model actor: builds the model once (from the object store, ``weights.py``), then embeds
    the decoded block of chunk after chunk (``decode.decode_chunks`` made them). Batch k's
    features come back to the host while batch k + 1 is launched (``host_copy.py``), so on a
    GPU the part is written while the device computes the next batch."""

    def __init__(self, *, model: Shared | str, **base) -> None:
        super().__init__(**base)
        self.model = model_of(model).to(self.device)

    def fill(self, chunk: Chunk, writer: PartWriter, *, images: np.ndarray, rows: bytes) -> None:
        """``images``: uint8 or float32 ``(chunk.rows, C, H, W)``, a read-only view of the block
        (the forward only reads it; uint8 is widened after the copy to the device);
        ``rows``: its ids (and labels), ``decode.decode_rows``."""
        table = decode_rows(rows)
        ids = table.column("id").combine_chunks()
        labels = table.column("label").to_numpy() if "label" in table.column_names else None
        writer.read(ids.cast(writer.schema.field("id").type))
        with warnings.catch_warnings():  # torch warns once about a non-writable array
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            pixels = torch.from_numpy(images)

        def write(start: int, stop: int, features: HostCopy) -> None:
            [vectors] = features.wait()
            batch_ids = ids.slice(start, stop - start)
            batch_labels = None if labels is None else labels[start:stop]
            writer.write(embedding_table(batch_ids, vectors.numpy(), labels=batch_labels))

        pending = None
        for start in range(0, chunk.rows, self.run.batch_size):
            stop = min(start + self.run.batch_size, chunk.rows)
            # the one host-to-device copy on GPU, then uint8 widened there
            batch = as_float_images(pixels[start:stop].to(self.device))
            features = embed(self.model, batch, self.autocast, self.staging.info.normalized)
            launched = (start, stop, copy_to_host([features]))
            if pending is not None:
                write(*pending)
            pending = launched
        if pending is not None:
            write(*pending)


def embed(model, images: torch.Tensor, autocast: torch.dtype | None, normalize: bool):
    """``(B, C, H, W)`` -> float32 ``(B, d)`` features (L2-normalised if ``normalize``):
    :func:`raycompat.engine.embed` of ``model.forward_features``."""
    return engine.embed(model.forward_features, images, normalize=normalize, autocast=autocast)


def check_model_width(model: str, target: VersionInfo) -> None:
    """The exported ``model`` embeds ``target.width``-d features: the model is built from its
    ``model.json`` on the meta device (no weight is read); else ``SchemaError`` naming both."""
    spec, _ = read_spec(model)
    with torch.device("meta"):
        width = build_model(spec).embed_dim
    if width != target.width:
        raise SchemaError(
            f"{model} embeds {width}-d features but target {target.version} "
            f"declares width {target.width}"
        )


@dataclass(frozen=True)
class ExtractPlan:
    """What an extraction writes, decided before any Ray work: the source's ``chunks`` (of
    ``decode.chunk_rows`` rows, sized from one image decoded here), the output ``schema``,
    whether ids are checked unique on the cluster (``distributed``) and the run's ``identity``
    (recorded in ``_plan.json``: a rerun with other inputs is refused)."""

    chunks: list[Chunk]
    schema: pa.Schema
    distributed: bool
    identity: dict


def plan_extraction(
    target: VersionInfo, model: str, source: SourceSpec, run: RunOptions, augment: str, seed: int
) -> ExtractPlan:
    """Check the inputs (augmentation name, model width, no side info) and plan the chunks."""
    AUGMENTATIONS.get(augment)
    check_model_width(model, target)
    if target.side_info_width is not None:
        raise SchemaError(
            f"target {target.version}: extraction writes no side_info column "
            f"(side_info_width must be None)"
        )
    images = open_source(source)
    rows_per_chunk = chunk_rows(run, images.image_shape(), 1 if images.hands_uint8() else 4)
    chunks = images.plan(rows_per_chunk)
    total = sum(c.rows for c in chunks)
    distributed = run.unique_ids == "distributed" or (
        run.unique_ids == "auto" and total >= DISTRIBUTED_UNIQUE_ROWS
    )
    id_type, with_label = images.id_type_and_labels()
    schema = embedding_schema(target.width, id_type, with_label=with_label, dtype=target.dtype)
    identity = {
        "kind": "extract",
        "model": file_digest(Path(model) / MODEL_FILE),
        "source": repr(source),
        "augment": augment,
        "seed": seed,
        "rows_per_file": rows_per_chunk,
    }
    return ExtractPlan(chunks, schema, distributed, identity)


def extract_version(
    store: GalleryStore,
    gallery: str,
    target: VersionInfo,
    model: str,
    source: SourceSpec,
    run: RunOptions | None = None,
    augment: str = "none",
    seed: int = 0,
    staging_name: str | None = None,
    verify: Callable[[Staging], None] | None = None,
) -> dict:
    """Embed every image of ``source`` with the exported ``model`` into version ``target``.

    Widths are checked before any Ray work (the model is built on the meta device).
    ``verify(staging)``, if given, runs before publishing (see :func:`transform_version`).
    Returns the progress summary plus ``"version"``, the published record.
    """
    run = run or RunOptions()
    plan = plan_extraction(target, model, source, run, augment, seed)
    pools = sized_pools(run, len(plan.chunks))
    decode = dict(source=source, augment=augment, seed=seed)
    staging = store.begin(gallery, target, staging_name or f"extract-{target.version}")
    return run_staged(
        store,
        gallery,
        staging,
        name=f"extract {gallery}/{target.version}",
        identity=plan.identity,
        chunks=plan.chunks,
        worker=ExtractChunks,
        worker_kwargs=dict(model=share_model(model)),
        schema=plan.schema,
        run=pools.model,
        verify=verify,
        # ids come from the image source, which nothing checked unique: at scale they are
        # grouped on the cluster and the commit reads part records only (O(parts))
        check="records" if plan.distributed else "rows",
        distributed_unique=plan.distributed,
        before=Stage(decode_chunks, decode, pools.decode_workers),
    )


def sized_pools(run: RunOptions, chunks: int) -> Pools:
    """Both pools sized from the cluster's live nodes (``decode.plan_pools``), logged."""
    nodes = live_nodes()
    pools = plan_pools(run, nodes, chunks)
    logger.info(
        "extraction pools from %s: %d model actor(s) x %d CPU x %s GPU, %d decode worker(s) x "
        "1 CPU",
        describe_nodes(nodes, chunks),
        pools.model.actors,
        pools.model.threads_per_actor,
        pools.model.num_gpus_per_actor,
        pools.decode_workers,
    )
    return pools
