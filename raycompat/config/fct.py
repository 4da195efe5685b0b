"""Typed configs for training the FCT pieces (Ramanujan et al., CVPR 2022, appendix D).

Two runs, two configs, loaded like every other config (``raycompat.config.load_config``:
defaults -> YAML -> ``key.sub=value``; unknown keys and wrong types are errors):

- :class:`SideInfoTrainConfig`: the SimCLR side-information model ``psi``, trained at old-model
  time on images only (labels are never read, except to pick ``data.classes``);
- :class:`TransformationTrainConfig`: the transformation ``h(phi_old, psi) -> phi_new`` (and
  optionally ``g(phi_old, psi_old) -> psi_new``), trained at upgrade time on stored triples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from raycompat.config import bounded
from raycompat.config.train import OptimSpec, RunSpec, ScalingSpec


@dataclass
class FCTOptimSpec(OptimSpec):
    """Model training's :class:`~raycompat.config.train.OptimSpec` (same type, same keys, one
    schedule: :func:`raycompat.train.schedule.lr_at`) with FCT appendix D.4.3's defaults for
    ``h``: Adam, lr 5e-4, weight decay 2^-15, 5 warm-up epochs, then cosine.

    A subclass only for its defaults: a section given in part keeps these, not SGD's. FCT runs
    evaluate the schedule per step (fractional epochs), as in ResNetV1.5 recipes, and refuse
    ``clip_grad_norm`` (:mod:`raycompat.fct.checks`).
    """

    name: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = bounded(5e-4, gt=0.0)
    weight_decay: float = bounded(3.0517578125e-5, ge=0.0)
    schedule: Literal["constant", "step", "cosine"] = "cosine"
    warmup_epochs: int = bounded(5, ge=0)


@dataclass
class ImageSource:
    """A registered dataset (:data:`raycompat.data.DATASETS`) read as unlabelled images."""

    name: str = "synthetic"
    options: dict = field(default_factory=dict)
    classes: list[int] = field(default_factory=list)  # the old-time data; empty: every row


@dataclass
class SideInfoSpec:
    """The SimCLR side-information model (``SIDE_INFO["simclr"]``): backbone + extra BN."""

    backbone: str = "resnet18"
    embed_dim: int = bounded(128, ge=1)  # FCT uses 64 or 128
    projection_dim: int = bounded(128, ge=1)
    backbone_kwargs: dict = field(default_factory=dict)


@dataclass
class SideInfoTrainConfig:
    data: ImageSource = field(default_factory=ImageSource)
    model: SideInfoSpec = field(default_factory=SideInfoSpec)
    # SimCLR itself uses LARS at batch 4096; Adam is the usual substitute at small batch sizes.
    optim: FCTOptimSpec = field(
        default_factory=lambda: FCTOptimSpec(lr=1e-3, weight_decay=1e-6, warmup_epochs=10)
    )
    temperature: float = bounded(0.1, gt=0.0)
    # smallest random-resized-crop scale of simclr_views
    crop_scale: float = bounded(0.5, gt=0.0, le=1.0)
    epochs: int = bounded(100, ge=1)
    # images per optimizer step over all workers together, two SimCLR views each; each worker
    # steps on batch_size // scaling.num_workers images, and NT-Xent's negatives are the other
    # views of the worker's own share
    batch_size: int = bounded(512, ge=1)
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    run: RunSpec = field(default_factory=lambda: RunSpec(name="side-info"))
    seed: int = bounded(0, ge=0)


@dataclass
class TransformationSpec:
    """``h``: FCT appendix D widths (2048); ``d_*`` must match the triples' widths."""

    d_old: int = bounded(ge=1)
    d_side: int = bounded(ge=0)  # 0: no side-information branch
    d_new: int = bounded(ge=1)
    width: int = bounded(2048, ge=1)
    normalize_output: bool = False  # set when the new embeddings are L2-normalised
    # FastFill's per-row uncertainty head, trained with the uncertainty-weighted loss
    # (raycompat.fct.losses.uncertain_transformation_loss); for partial backfills
    uncertainty: bool = False


@dataclass
class SideInfoTransformationSpec:
    """``g``: ``(phi_old, psi_old) -> psi_new`` (FCT sec. 4.3); inputs as ``h``."""

    d_side_new: int = bounded(ge=1)
    width: int = bounded(2048, ge=1)


@dataclass
class TransformationTrainConfig:
    triples: str  # a directory written by Triples.save (old.npy, side.npy, new.npy[, side_new])
    h: TransformationSpec
    g: SideInfoTransformationSpec | None = None
    optim: FCTOptimSpec = field(default_factory=FCTOptimSpec)
    epochs: int = bounded(80, ge=1)
    # triples per optimizer step over all workers together; each worker steps on
    # batch_size // scaling.num_workers of them
    batch_size: int = bounded(1024, ge=1)
    scaling: ScalingSpec = field(default_factory=lambda: ScalingSpec(precision="fp32"))
    run: RunSpec = field(default_factory=lambda: RunSpec(name="fct-transformation"))
    seed: int = bounded(0, ge=0)
    # FastFill's discriminative term (h.uncertainty only): an exported new model whose
    # classifier (forward_head, held fixed) scores h's output against the triples' labels.npy
    classifier: str | None = None
    discriminative_weight: float = bounded(1.0, ge=0.0)
    # Where the error h's uncertainty estimates is measured (h.uncertainty only): "cosine" for a
    # normalised gallery (unit vectors, what cosine search compares), "l2" for raw rows
    uncertainty_error: Literal["l2", "cosine"] = "l2"


@dataclass
class FCTSpec:
    """How an upgrade or a sweep trial learns ``h(phi_old) -> phi_new`` between two trained
    models (FCT sec. 3.3, appendix D; :func:`raycompat.cluster.train.fct_fit.fit_transformation`).

    ``width`` is h's hidden width (2048 in the paper; smaller for toy widths). Stored galleries
    hold no side-information column, so h maps ``phi_old`` alone (FCT's no-side-info variant).
    """

    width: int = bounded(256, ge=1)
    epochs: int = bounded(30, ge=1)
    # triples per optimizer step of h's run, over all workers together (its
    # TransformationTrainConfig.batch_size)
    batch_size: int = bounded(256, ge=1)
    optim: FCTOptimSpec = field(default_factory=lambda: FCTOptimSpec(warmup_epochs=2))


@dataclass
class PartialBackfillSpec:
    """A FastFill partial backfill (Jaeckle et al., ICLR 2023; docs/backfill.md): an upgrade
    entry's or policy's ``partial_backfill`` (``raycompat.config.upgrade``, which re-exports it)
    and an FCT sweep's ``backfill`` section.

    The new version is ``h(current)`` with a fraction ``budget`` of its rows re-extracted by the
    new model, in ``order``: ``uncertainty`` (FastFill: the rows ``h`` is least sure of first)
    or ``random`` (the baseline).

    Attributes:
        budget: the fraction of the gallery re-extracted, in [0, 1]
            (:func:`raycompat.backfill.check_budget`).
        target: the report gives the budget that reaches ``target`` x the new/new accuracy.
        uncertainty_weight: the weight ``w`` of the discriminative term of FastFill's
            uncertainty loss (the new model's classifier on ``h(phi_old)``;
            :func:`raycompat.fct.losses.uncertain_transformation_loss`); 0: the
            heteroscedastic MSE alone.
    """

    budget: float = bounded(ge=0.0, le=1.0)
    order: Literal["uncertainty", "random"] = "uncertainty"
    target: float = bounded(0.95, gt=0.0, le=1.0)
    uncertainty_weight: float = bounded(1.0, ge=0.0)
