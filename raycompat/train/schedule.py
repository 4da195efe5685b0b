"""Optimisers and the learning-rate schedule by name, one of each for every training run.

Model training evaluates the schedule once per epoch (CoReS: SGD 0.1, x0.1 at milestones); FCT's
runs evaluate it per step at fractional epochs (Ramanujan et al., CVPR 2022, appendix D: linear
warm-up, then cosine), both through :func:`lr_at` on an :class:`~raycompat.config.train.OptimSpec`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from raycompat.config.train import OptimSpec

OPTIMIZERS: dict[str, Callable] = {
    "sgd": lambda params, s: torch.optim.SGD(
        params, lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay
    ),
    "adam": lambda params, s: torch.optim.Adam(params, lr=s.lr, weight_decay=s.weight_decay),
    "adamw": lambda params, s: torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay),
}


def optimizer_factory(spec: OptimSpec) -> Callable[[list], torch.optim.Optimizer]:
    build = OPTIMIZERS[spec.name]
    return lambda params: build(list(params), spec)


def lr_at(spec: OptimSpec, epoch: float, epochs: int) -> float:
    """Learning rate at ``epoch`` (0-based; fractional for a per-step schedule): linear warm-up
    over ``warmup_epochs``, then constant / step (x ``gamma`` at each milestone) / cosine to 0
    at ``epochs`` (and 0 after it)."""
    if epoch < spec.warmup_epochs:
        return spec.lr * (epoch + 1) / (spec.warmup_epochs + 1)
    if spec.schedule == "step":
        return spec.lr * spec.gamma ** sum(epoch >= m for m in spec.milestones)
    if spec.schedule == "cosine":
        span = max(1, epochs - spec.warmup_epochs)
        done = min(epoch - spec.warmup_epochs, span)
        return spec.lr * 0.5 * (1 + math.cos(math.pi * done / span))
    return spec.lr


def warmup_cosine(epoch: float, epochs: int, warmup_epochs: int = 5) -> float:
    """LR multiplier: linear warm-up for ``warmup_epochs`` then cosine to 0 (FCT appendix D):
    :func:`lr_at` of a cosine schedule with ``lr`` 1."""
    return lr_at(OptimSpec(lr=1.0, schedule="cosine", warmup_epochs=warmup_epochs), epoch, epochs)
