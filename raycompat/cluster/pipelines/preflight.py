"""What ``jobs/transform.py`` checks before Ray starts: inputs exist and fit the target's width,
and the target is new.

A missing ``h``, model or source version found inside a Ray actor costs a cluster start and a
retry storm, and its error is buried in a worker's traceback. These checks read only small
files (specs and version records) on the driver; the weights themselves are loaded by the
actors.
"""

from __future__ import annotations

import logging
from pathlib import Path

from raycompat.errors import ConfigError, ManifestError, PublishConflictError
from raycompat.store import GalleryStore, VersionInfo

log = logging.getLogger(__name__)


def check_directory(key: str, directory: str | None, files: tuple[str, ...], made_by: str) -> None:
    """``directory`` (a local folder) holds ``files``; else one error naming the key and path."""
    if not directory:
        raise ConfigError(f"{key} must be set: the directory {made_by} exported")
    missing = [name for name in files if not (Path(directory) / name).is_file()]
    if missing:
        raise ConfigError(
            f"{key}: {Path(directory) / missing[0]} not found; point {key} at the directory "
            f"{made_by} exported ({', '.join(files)})"
        )


def check_model_width(model: str, width: int) -> None:
    """The exported ``model`` embeds ``width``-d features, else one error naming the key and
    both widths. The model is built from its ``model.json`` on the meta device: no weight is
    read, so a 2-d target for a 9-d model fails here in a second, not in a Ray actor."""
    import torch

    from raycompat.train.export import build_model, read_spec

    spec, _ = read_spec(model)
    with torch.device("meta"):
        embeds = build_model(spec).embed_dim
    if embeds != width:
        raise ConfigError(
            f"target.width: {width}, but model {model} embeds {embeds}-d features "
            f"(its model.json: {spec.backbone} + {spec.head}); set target.width={embeds}"
        )


def check_transformation_width(directory: str, width: int) -> None:
    """``h`` in ``directory`` maps to ``width``-d features (its ``h.json`` ``d_new``), else one
    error naming the key and both widths."""
    from raycompat.transformations import H, read_transformation_spec

    d_new = read_transformation_spec(directory, H).d_new
    if d_new != width:
        raise ConfigError(
            f"target.width: {width}, but transformation {directory} maps to {d_new}-d features "
            f"(its h.json d_new); set target.width={d_new}"
        )


def check_inputs(cfg, store: GalleryStore) -> None:
    """The transformation or model directories and the source version of a transform job."""
    from raycompat.train.export import MODEL_FILE, SPEC_FILE

    gallery = cfg.store.gallery
    if cfg.mode == "transform":
        made_by = "the FCT transformation run"
        check_directory("transformation", cfg.transformation, ("h.safetensors", "h.json"), made_by)
        check_transformation_width(cfg.transformation, cfg.target.width)
        if cfg.side_info_transformation:
            g_files = ("g.safetensors", "g.json")
            g_dir = cfg.side_info_transformation
            check_directory("side_info_transformation", g_dir, g_files, made_by)
    if cfg.mode == "extract":
        check_directory("model", cfg.model, (MODEL_FILE, SPEC_FILE), "a training run")
        check_model_width(cfg.model, cfg.target.width)
    if cfg.mode in ("transform", "identity"):
        if not cfg.source_version:
            raise ConfigError("source_version must be set: the version to read")
        try:
            store.version(gallery, cfg.source_version)
        except ManifestError as err:
            raise ConfigError(f"source_version: {err}") from None


def already_published(store: GalleryStore, gallery: str, target: VersionInfo) -> VersionInfo | None:
    """The published target version when an earlier run of this job published it (a rerun after
    a kill that came after the publish), None when it is new. A version of that name written by
    another model or width is a conflict, not a rerun."""
    try:
        existing = store.version(gallery, target.version)
    except ManifestError:
        return None
    same = (existing.model_version, existing.width) == (target.model_version, target.width)
    if not same:
        raise PublishConflictError(
            f"{gallery}/{target.version} is already published by model "
            f"{existing.model_version!r} ({existing.width}-d), not {target.model_version!r} "
            f"({target.width}-d); choose another target.version"
        )
    return existing
