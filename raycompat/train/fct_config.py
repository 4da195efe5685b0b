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

from raycompat.train.config import RunSpec, ScalingSpec


@dataclass
class FCTOptimSpec:
    """Optimizer and the linear warm-up + cosine schedule (``transformation.warmup_cosine``).

    Defaults are FCT appendix D.4.3 for ``h``: Adam, lr 5e-4, weight decay 2^-15, 5 warm-up
    epochs. The schedule is evaluated per step (fractional epochs), as in ResNetV1.5 recipes.
    """

    name: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = 5e-4
    weight_decay: float = 3.0517578125e-5
    momentum: float = 0.9  # sgd only
    warmup_epochs: int = 5


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
    embed_dim: int = 128  # FCT uses 64 or 128
    projection_dim: int = 128
    backbone_kwargs: dict = field(default_factory=dict)


@dataclass
class SideInfoTrainConfig:
    data: ImageSource = field(default_factory=ImageSource)
    model: SideInfoSpec = field(default_factory=SideInfoSpec)
    # SimCLR itself uses LARS at batch 4096; Adam is the usual substitute at small batch sizes.
    optim: FCTOptimSpec = field(
        default_factory=lambda: FCTOptimSpec(lr=1e-3, weight_decay=1e-6, warmup_epochs=10)
    )
    temperature: float = 0.1
    crop_scale: float = 0.5  # smallest random-resized-crop scale of simclr_views
    epochs: int = 100
    batch_size: int = 512  # global, split over the workers; negatives are per worker
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    run: RunSpec = field(default_factory=lambda: RunSpec(name="side-info"))
    seed: int = 0


@dataclass
class TransformationSpec:
    """``h``: FCT appendix D widths (2048); ``d_*`` must match the triples' widths."""

    d_old: int
    d_side: int  # 0: no side-information branch
    d_new: int
    width: int = 2048
    normalize_output: bool = False  # set when the new embeddings are L2-normalised


@dataclass
class SideInfoTransformationSpec:
    """``g``: ``(phi_old, psi_old) -> psi_new`` (FCT sec. 4.3); inputs as ``h``."""

    d_side_new: int
    width: int = 2048


@dataclass
class TransformationTrainConfig:
    triples: str  # a directory written by Triples.save (old.npy, side.npy, new.npy[, side_new])
    h: TransformationSpec
    g: SideInfoTransformationSpec | None = None
    optim: FCTOptimSpec = field(default_factory=FCTOptimSpec)
    epochs: int = 80
    batch_size: int = 1024  # global, split over the workers
    scaling: ScalingSpec = field(default_factory=lambda: ScalingSpec(precision="fp32"))
    run: RunSpec = field(default_factory=lambda: RunSpec(name="fct-transformation"))
    seed: int = 0


@dataclass
class FCTSpec:
    """How an upgrade or a sweep trial learns ``h(phi_old) -> phi_new`` between two trained
    models (FCT sec. 3.3, appendix D; :func:`raycompat.train.fct_fit.fit_transformation`).

    ``width`` is h's hidden width (2048 in the paper; smaller for toy widths). Stored galleries
    hold no side-information column, so h maps ``phi_old`` alone (FCT's no-side-info variant).
    """

    width: int = 256
    epochs: int = 30
    batch_size: int = 256
    optim: FCTOptimSpec = field(default_factory=lambda: FCTOptimSpec(warmup_epochs=2))
