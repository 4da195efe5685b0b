"""Training-time augmentations on float images, in two halves: draw and apply.

An :class:`Augmentation` draws each image's parameters from a seeded ``torch.Generator``
(:meth:`~Augmentation.draw`, a few scalars, cheap) and applies them to a whole batch at once
(:meth:`~Augmentation.apply`, on any device). The training loader draws in the training
process, in exactly the order of the images (so a seed gives the same images whichever process
decodes them), and applies where the pixels are: in the decode workers on CPU, on the GPU after
the copy when there is one (flips and crops are copies, so both give the same values).

Calling an augmentation on one ``(C, H, W)`` image with a generator (``augment(image, gen)``)
draws and applies in one go: what the Ray Data loader and extraction do per row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raycompat.registry import Registry


class Augmentation:
    """Base class: ``params`` scalars per image (``(B, params)`` int64), drawn then applied."""

    params = 0

    def draw(self, generator: torch.Generator) -> list[int]:
        """One image's parameters, drawn from ``generator`` (``params`` ints)."""
        return []

    def draw_batch(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """``(count, params)`` int64: :meth:`draw` for each of ``count`` images in turn."""
        return torch.tensor([self.draw(generator) for _ in range(count)], dtype=torch.int64).view(
            count, self.params
        )

    def apply(self, images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` images with each row's ``params`` applied (same device as images)."""
        return images

    def __call__(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if not self.params:
            return image
        params = torch.tensor([self.draw(generator)], dtype=torch.int64)
        return self.apply(image[None], params)[0]


AUGMENTATIONS: Registry[Augmentation] = Registry("augmentation")


def _register(name: str):
    def decorator(cls: type[Augmentation]) -> type[Augmentation]:
        AUGMENTATIONS.register(name)(cls())
        return cls

    return decorator


@_register("none")
class NoAugment(Augmentation):
    """The image as decoded."""


def _draw_flip(generator: torch.Generator) -> int:
    return int(torch.rand((), generator=generator) < 0.5)


def _flip(images: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    mask = flip.to(device=images.device, dtype=torch.bool).view(-1, 1, 1, 1)
    return torch.where(mask, images.flip(-1), images)


@_register("flip")
class HorizontalFlip(Augmentation):
    """Mirror left-right with probability 1/2 (face datasets: CASIA-WebFace, CelebA)."""

    params = 1

    def draw(self, generator: torch.Generator) -> list[int]:
        return [_draw_flip(generator)]

    def apply(self, images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        return _flip(images, params[:, 0])


@_register("crop_flip")
class CropFlip(Augmentation):
    """CIFAR augmentation: zero-pad by ``padding``, random crop back to size, random flip.

    Parameters per image: ``(top, left, flip)``."""

    params = 3
    padding = 4

    def draw(self, generator: torch.Generator) -> list[int]:
        top, left = torch.randint(0, 2 * self.padding + 1, (2,), generator=generator).tolist()
        return [top, left, _draw_flip(generator)]

    def apply(self, images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        b, _, h, w = images.shape
        pad = self.padding
        padded = F.pad(images, (pad, pad, pad, pad))
        params = params.to(images.device)
        rows = params[:, 0, None] + torch.arange(h, device=images.device)  # (B, H)
        cols = params[:, 1, None] + torch.arange(w, device=images.device)  # (B, W)
        batch = torch.arange(b, device=images.device)[:, None, None]
        # advanced indexing around the channel slice puts it last: (B, H, W, C)
        crops = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]
        return _flip(crops.permute(0, 3, 1, 2).contiguous(), params[:, 2])
