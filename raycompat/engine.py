"""Plain-PyTorch training and extraction loops shared by the demo and the Ray Train workers.

Nothing here knows about Ray: a Ray worker calls :func:`train_epoch` on its shard of the data,
the same way the single-process demo does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from raycompat.methods import Batch, CompatibilityMethod

log = logging.getLogger(__name__)


def train_epoch(
    model: nn.Module,
    method: CompatibilityMethod,
    batches: Iterable[Batch],
    optimizer: torch.optim.Optimizer,
) -> dict[str, float]:
    """One pass over ``batches``; returns the mean of every loss term."""
    model.train()
    sums: dict[str, float] = {}
    steps = 0
    for batch in batches:
        terms = method(model, batch)
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        optimizer.step()
        for name, value in terms.items():
            sums[name] = sums.get(name, 0.0) + float(value.detach())
        steps += 1
    if steps == 0:
        raise ValueError("train_epoch got no batches: the training split is empty")
    return {name: total / steps for name, total in sums.items()}


@torch.no_grad()
def extract_features(model: nn.Module, images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """``(N, C, H, W)`` -> ``(N, embed_dim)`` features in eval mode, in batches."""
    was_training = model.training
    model.eval()
    parts = [
        model.forward_features(images[i : i + batch_size])
        for i in range(0, len(images), batch_size)
    ]
    model.train(was_training)
    return torch.cat(parts) if parts else images.new_zeros(0, model.embed_dim)


def tensor_batches(
    images: torch.Tensor,
    targets: torch.Tensor,
    batch_size: int,
    generator: torch.Generator | None = None,
    shuffle: bool = True,
    replay: torch.Tensor | None = None,
) -> Iterator[Batch]:
    """Mini-batches over in-memory tensors (small datasets such as MNIST-5k)."""
    n = len(images)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        yield Batch(
            images=images[idx], targets=targets[idx], replay=None if replay is None else replay[idx]
        )
