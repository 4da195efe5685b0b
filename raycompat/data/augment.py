"""Training-time augmentations on ``(C, H, W)`` float tensors, seeded by a ``torch.Generator``.

Decoding and augmenting happen per worker (a DataLoader worker or a Ray Data actor), so every
augmentation takes the generator explicitly: two runs with the same seed see the same images.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from raycompat.registry import Registry

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
AUGMENTATIONS: Registry = Registry("augmentation")


@AUGMENTATIONS.register("none")
def no_augment(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return image


@AUGMENTATIONS.register("flip")
def horizontal_flip(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror left-right with probability 1/2 (face datasets: CASIA-WebFace, CelebA)."""
    if torch.rand((), generator=generator) < 0.5:
        return image.flip(-1)
    return image


@AUGMENTATIONS.register("crop_flip")
def crop_flip(image: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """CIFAR augmentation: zero-pad by ``padding``, random crop back to size, random flip."""
    _, h, w = image.shape
    padded = F.pad(image, (padding, padding, padding, padding))
    top, left = (int(v) for v in torch.randint(0, 2 * padding + 1, (2,), generator=generator))
    return horizontal_flip(padded[:, top : top + h, left : left + w], generator)
