"""Checks of the FCT training configs, run on the driver before any worker starts.

Each bad input is an error naming the config key or the file (and row) at fault, so a wrong
width or a corrupt triples file fails in seconds rather than inside a Ray worker. No Ray here.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np
import torch

from raycompat.config.fct import ImageSource, SideInfoTrainConfig, TransformationTrainConfig
from raycompat.config.train import OptimSpec
from raycompat.data import create_dataset
from raycompat.fct.triples import Triples, check_triples
from raycompat.nn.side_info import create_side_info

log = logging.getLogger(__name__)


def image_rows(source: ImageSource, labels: np.ndarray) -> np.ndarray:
    """Rows the side-information model may see: every row, or those of ``data.classes``."""
    if not source.classes:
        return np.arange(len(labels))
    absent = sorted(set(source.classes) - set(np.unique(labels).tolist()))
    if absent:
        raise ValueError(f"data.classes: classes {absent[:10]} have no rows in {source.name}")
    return np.flatnonzero(np.isin(labels, source.classes))


def check_batches(batch_size: int, world: int, rows: int, what: str) -> None:
    """Every worker needs >= 2 samples per step (BatchNorm, NT-Xent) and >= 1 full step."""
    per_worker = batch_size // world
    if per_worker < 2:
        raise ValueError(
            f"batch_size={batch_size} gives {per_worker} per worker for {world} "
            "workers; BatchNorm and NT-Xent need at least 2"
        )
    if -(-rows // world) < per_worker:
        raise ValueError(
            f"{what}: {rows} rows over {world} workers is less than one batch of "
            f"{per_worker} per worker; lower batch_size"
        )


def check_optim(optim: OptimSpec) -> None:
    """FCT runs share model training's optimizer section but do not clip gradients (their
    steps are not guarded; :mod:`raycompat.cluster.train.worker`)."""
    if optim.clip_grad_norm is not None:
        raise ValueError("optim.clip_grad_norm: FCT training runs do not clip gradients; unset it")


def check_side_info_config(cfg: SideInfoTrainConfig) -> None:
    check_optim(cfg.optim)
    dataset = create_dataset(cfg.data.name, **cfg.data.options)
    rows = image_rows(cfg.data, dataset.labels)
    check_batches(cfg.batch_size, cfg.scaling.num_workers, len(rows), f"data {cfg.data.name}")
    model = create_side_info("simclr", **dataclasses.asdict(cfg.model)).eval()
    image = dataset[int(rows[0])][0]
    try:
        with torch.no_grad():
            model(torch.stack([image, image]))
    except RuntimeError as err:
        raise ValueError(
            f"model.backbone {cfg.model.backbone!r} does not take images of shape "
            f"{tuple(image.shape)} from {cfg.data.name}: {err}"
        ) from err


def check_transformation_config(cfg: TransformationTrainConfig) -> str:
    """Validate the triples against the configured widths; returns their absolute path."""
    check_optim(cfg.optim)
    path = os.path.abspath(cfg.triples)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"triples: {path} is not a directory")
    triples = Triples.load(path)
    widths = {"old": cfg.h.d_old, "side": cfg.h.d_side, "new": cfg.h.d_new}
    if cfg.g is not None:
        widths["side_new"] = cfg.g.d_side_new
    check_triples(triples, path, widths, unit_norm="new" if cfg.h.normalize_output else "")
    head = np.asarray(triples.new[:1024], dtype=np.float64)
    if not cfg.h.normalize_output and np.allclose(np.linalg.norm(head, axis=1), 1.0, atol=1e-3):
        log.warning(
            "triples %s: the new embeddings look L2-normalised; FCT then normalises h's "
            "output (h.normalize_output=true)",
            path,
        )
    check_batches(cfg.batch_size, cfg.scaling.num_workers, len(triples), f"triples {path}")
    if cfg.classifier is not None:
        check_classifier(cfg, triples, path)
    if cfg.epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {cfg.epochs}")
    if cfg.scaling.strategy == "fsdp":  # FSDP shards backbone blocks; h and g have none
        raise ValueError(
            "scaling.strategy=fsdp: h and g are small MLPs without a backbone to shard; use ddp"
        )
    return path


def check_classifier(cfg: TransformationTrainConfig, triples: Triples, path: str) -> None:
    """FastFill's discriminative term: the uncertainty loss, labels, a head of h's width."""
    from raycompat.train.export import load_exported_model

    if not cfg.h.uncertainty:
        raise ValueError(
            "classifier: the discriminative term is part of FastFill's uncertainty loss; "
            "set h.uncertainty=true"
        )
    if triples.labels is None:
        raise ValueError(
            f"classifier: triples {path}/labels.npy is missing; compute the triples with "
            "with_labels=True"
        )
    model, _ = load_exported_model(cfg.classifier)
    if model.embed_dim != cfg.h.d_new:
        raise ValueError(
            f"classifier {cfg.classifier} takes features of width {model.embed_dim}, but h "
            f"outputs h.d_new={cfg.h.d_new}"
        )
    labels = np.asarray(triples.labels)
    if labels.min() < 0 or labels.max() >= model.num_classes:
        raise ValueError(
            f"triples {path}/labels.npy holds classes outside [0, {model.num_classes}) of "
            f"classifier {cfg.classifier}"
        )
