"""Extraction: images -> decode/augment -> model actors -> a new gallery version.

    extract_version(store, "faces", VersionInfo("v1", "resnet50-e90", 512, True,
                    "v1 = extract(resnet50-e90)"), "runs/step1/model",
                    SourceSpec(kind="dataset", name="casia_webface", options={"root": ...}))

The backfill baseline and the initial index. The driver reads the exported model
(``model.safetensors`` + ``model.json``) once and puts it in Ray's object store
(``weights.py``); each actor opens the image source and builds the model from it once, then
streams its chunks: decode and augment a batch at a time in a read-ahead thread
(:mod:`raycompat.cluster.pipelines.prefetch`) while ``forward_features`` (bf16 autocast on GPU by
default)
runs on the previous batch, L2-normalise if the version is ``normalized``, write one part file
per chunk. Same resumable protocol and publishing as :mod:`raycompat.cluster.pipelines.transform`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch

from raycompat import engine
from raycompat.cluster.pipelines.inputs import file_digest
from raycompat.cluster.pipelines.parts import Chunk, PartWriter
from raycompat.cluster.pipelines.prefetch import prefetch
from raycompat.cluster.pipelines.runner import (
    DISTRIBUTED_UNIQUE_ROWS,
    ChunkWorker,
    RunOptions,
    run_staged,
)
from raycompat.cluster.pipelines.sources import SourceSpec, open_source
from raycompat.cluster.pipelines.weights import Shared, model_of, share_model
from raycompat.data.augment import AUGMENTATIONS
from raycompat.store import (
    GalleryStore,
    SchemaError,
    VersionInfo,
    embedding_schema,
    embedding_table,
)
from raycompat.store.staging import Staging
from raycompat.train.export import MODEL_FILE, build_model, read_spec

# Batches decoded ahead of the model: one queued plus one being decoded (memory: three batches
# of images per actor)
PREFETCH_BATCHES = 1


class ExtractChunks(ChunkWorker):
    """Actor: opens the source and builds the model once (from the object store, ``weights.py``),
    then embeds chunk after chunk."""

    def __init__(
        self, *, model: Shared | str, source: SourceSpec, augment: str, seed: int, **base
    ) -> None:
        super().__init__(**base)
        self.model = model_of(model).to(self.device)
        self.source = open_source(source)
        self.augment = AUGMENTATIONS.get(augment)
        self.seed = seed

    def fill(self, chunk: Chunk, writer: PartWriter) -> None:
        # Seeded per chunk, so a redone chunk sees the same augmentation as the first try.
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + chunk.start)
        batches = self.source.batches(chunk, self.run.batch_size, self.augment, generator)
        # the next batch is read and decoded in a thread while the model runs on this one
        with closing(prefetch(batches, depth=PREFETCH_BATCHES)) as ready:
            for ids, images, labels in ready:
                writer.read(pa.array(ids).cast(writer.schema.field("id").type))
                features = embed(
                    self.model, images.to(self.device), self.autocast, self.staging.info.normalized
                )
                writer.write(embedding_table(ids, features.cpu().numpy(), labels=labels))


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
    """What an extraction writes, decided before any Ray work: the source's ``chunks``, the
    output ``schema``, whether ids are checked unique on the cluster (``distributed``) and the
    run's ``identity`` (recorded in ``_plan.json``: a rerun with other inputs is refused)."""

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
    chunks = images.plan(run.rows_per_file)
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
        "rows_per_file": run.rows_per_file,
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
    staging = store.begin(gallery, target, staging_name or f"extract-{target.version}")
    return run_staged(
        store,
        gallery,
        staging,
        name=f"extract {gallery}/{target.version}",
        identity=plan.identity,
        chunks=plan.chunks,
        worker=ExtractChunks,
        worker_kwargs=dict(model=share_model(model), source=source, augment=augment, seed=seed),
        schema=plan.schema,
        run=run,
        verify=verify,
        # ids come from the image source, which nothing checked unique: at scale they are
        # grouped on the cluster and the commit reads part records only (O(parts))
        check="records" if plan.distributed else "rows",
        distributed_unique=plan.distributed,
    )
