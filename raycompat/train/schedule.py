"""Optimisers and learning-rate schedules by name (CoReS: SGD 0.1, x0.1 at milestones)."""

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


def lr_at(spec: OptimSpec, epoch: int, epochs: int) -> float:
    """Learning rate of ``epoch`` (0-based): linear warm-up, then constant / step / cosine."""
    if epoch < spec.warmup_epochs:
        return spec.lr * (epoch + 1) / (spec.warmup_epochs + 1)
    if spec.schedule == "step":
        return spec.lr * spec.gamma ** sum(epoch >= m for m in spec.milestones)
    if spec.schedule == "cosine":
        span = max(1, epochs - spec.warmup_epochs)
        return spec.lr * 0.5 * (1 + math.cos(math.pi * (epoch - spec.warmup_epochs) / span))
    return spec.lr
