"""Typed config of ``jobs/transform.py`` (YAML -> dataclasses; unknown keys are errors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from raycompat.config import bounded
from raycompat.pipelines.runner import RunOptions
from raycompat.pipelines.sources import SourceSpec


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
