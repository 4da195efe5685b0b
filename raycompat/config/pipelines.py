"""Typed config of ``jobs/transform.py`` and of every pipeline run (YAML -> dataclasses; unknown
keys are errors). No Ray: the upgrade job validates these before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from raycompat.config import bounded


@dataclass
class RunOptions:
    """How a pipeline runs (the same keys in every ``configs/transform_*.yaml``).

    Attributes:
        rows_per_file: target rows per output part (parts never split an input row group).
        batch_size: rows per model call inside an actor (images per ``forward_features``
            call when extracting), and so rows per Arrow batch where a pipeline reads stored
            rows (transform, backfill, a map's pairs); bounds memory per actor, never a result.
        actors: maximum actors in the pool (one model copy each).
        threads_per_actor: torch intra-op threads per actor (and the CPUs it reserves).
        num_gpus_per_actor: 0 on CPU; 1 (or a fraction) to put each model on a GPU.
        precision: ``"auto"`` or ``"bf16"`` (bf16 autocast on GPU, fp32 on CPU), or ``"fp32"``
            (``raycompat.precision``, the rule training follows too).
        progress_every_s: seconds between progress log lines.
        unique_ids: how an extraction checks its ids unique before publishing: ``"driver"``
            reads every id on the driver (``commit(check="rows")``), ``"distributed"`` groups
            them with Ray Data on the cluster and commits from part records, ``"auto"`` picks
            ``"distributed"`` from ``DISTRIBUTED_UNIQUE_ROWS`` rows on. (A transform needs
            neither: its source was unique and it maps rows 1:1.)
        pool: ``"fixed"``: ``actors`` actors with ``num_gpus_per_actor`` GPU each, as written;
            ``"auto"``: both derived from the cluster's nodes when the job starts (several
            actors share each GPU, or one actor per ``threads_per_actor`` CPUs without GPUs;
            ``raycompat.cluster.pipelines.pool``). Extraction sizes its model actors its own
            way under ``"auto"`` (one per GPU, or half the CPUs without GPUs;
            ``raycompat.cluster.pipelines.decode``); backfill runs ``actors`` as written.
        decode_workers: extraction only: CPU workers that decode and augment the images in
            front of the model actors (1 CPU each). None: the cluster's CPUs left over by the
            model actors (``decode.plan_pools``; the sizes are logged).
        decode_block_mib: extraction only: MiB of decoded images per chunk at most, as the
            decode workers hand them over (uint8 where the source decodes to it, else float32;
            a chunk is one block handed from a decode worker to a model actor); chunks are
            ``rows_per_file`` rows or fewer to fit, in whole batches (``decode.chunk_rows``).
    """

    rows_per_file: int = 1_000_000
    batch_size: int = 65536
    actors: int = 2
    threads_per_actor: int = 1
    num_gpus_per_actor: float = 0.0
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    progress_every_s: float = 10.0
    unique_ids: Literal["auto", "driver", "distributed"] = "auto"
    pool: Literal["fixed", "auto"] = "fixed"
    decode_workers: int | None = None
    decode_block_mib: int = 128

    def __post_init__(self) -> None:
        for name in (
            "rows_per_file",
            "batch_size",
            "actors",
            "threads_per_actor",
            "decode_block_mib",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"run.{name} must be >= 1, got {getattr(self, name)}")
        if self.decode_workers is not None and self.decode_workers < 1:
            raise ValueError(f"run.decode_workers must be >= 1 or null, got {self.decode_workers}")


@dataclass
class SourceSpec:
    """Config of an image source. ``kind``: a name in :data:`SOURCES`.

    ``dataset``: ``name`` and ``options`` of ``create_dataset``. ``parquet_images``: ``paths``
    (local files or pyarrow URIs), decoded with ``mode`` and resized to ``image_size``.
    """

    kind: str = "dataset"
    name: str = "mnist5k"
    options: dict = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    mode: str = "RGB"
    image_size: int | None = None


@dataclass
class StoreSpec:
    """Where the gallery lives: ``root`` is a local directory or ``s3://bucket/prefix``."""

    root: str = ""
    gallery: str = ""
    storage_options: dict = field(default_factory=dict)  # s3fs options
    # A staging area whose job has not heartbeat for this long may be taken over by a rerun
    # (a rerun on the same host takes a dead process's staging area at once).
    lease_timeout_s: float = bounded(120.0, gt=0)


@dataclass
class TargetSpec:
    """The version the job publishes (fields of ``raycompat.store.VersionInfo``)."""

    version: str = ""
    model_version: str = ""
    width: int = 0
    normalized: bool = False
    lineage: str = ""  # default: "<version> = h(<source>)" or "<version> = extract(<model>)"
    side_info_width: int | None = None
    staging_name: str | None = None  # default: transform-<source> / extract-<version>
    dtype: Literal["float32", "float16"] = "float32"  # stored embeddings; float16: half the bytes


@dataclass
class TransformJobConfig:
    """``mode``: ``transform`` (FCT h/g over ``source_version``), ``extract`` (images through
    ``model``) or ``identity`` (backward-compatible upgrade: check and return, no rewrite)."""

    mode: Literal["transform", "extract", "identity"] = "transform"
    store: StoreSpec = field(default_factory=StoreSpec)
    target: TargetSpec = field(default_factory=TargetSpec)
    source_version: str = ""  # transform / identity
    transformation: str = ""  # transform: directory holding h.safetensors + h.json
    side_info_transformation: str | None = None  # directory holding g.*, or None
    model: str = ""  # extract: exported model directory; identity: ignored
    images: SourceSpec = field(default_factory=SourceSpec)  # extract
    augment: str = "none"
    seed: int = 0
    run: RunOptions = field(default_factory=RunOptions)
    ray_address: str | None = None
