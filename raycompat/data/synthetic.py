"""Seeded synthetic identities: an image dataset of any size that stores no images.

Generative model (all draws seeded by ``(seed, what, index)``, so any row is reproducible alone):

- a shared basis ``B`` of ``rank`` smooth random images (low-resolution noise upsampled);
- class ``c`` has a code ``z_c ~ N(0, I_rank)``; its prototype is ``z_c B / sqrt(rank)``. With
  ``rank`` well below the number of classes the prototypes are correlated (they share one
  low-dimensional subspace), as identities are;
- image ``i`` of class ``c``: code ``z_c + s_w * e_i`` (within-class variation lying in the same
  subspace, so a linear read-out cannot simply ignore it), rendered, cyclically shifted by up to
  ``s_shift`` pixels, scaled by a random contrast, offset by a random brightness, plus pixel noise,
  then squashed to ``(0, 1)`` with a sigmoid.

``difficulty`` scales every nuisance (``s_w``, shift, contrast, brightness, noise) together;
at the default 1.0 a nearest-class-mean classifier on raw pixels is well above chance and well
below perfect (see ``tests/data/test_readers.py``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from raycompat.data.base import ImageDataset, Transform


class SyntheticIdentities(ImageDataset):
    """``num_classes * images_per_class`` rows; row ``i`` is of class ``i // images_per_class``.

    Args:
        num_classes, images_per_class: dataset size (millions of rows are fine: only the labels,
            ``8 N`` bytes, and the basis, ``rank * C * H * W`` floats, are stored).
        image_size: side ``S`` of the square ``(channels, S, S)`` images.
        seed: selects the basis, the class codes and every per-image draw.
        difficulty: scale of all nuisances (0 = every image equals its class prototype).
        rank: dimension of the shared subspace of class codes.
    """

    def __init__(
        self,
        num_classes: int,
        images_per_class: int,
        image_size: int = 32,
        channels: int = 3,
        seed: int = 0,
        difficulty: float = 1.0,
        rank: int = 16,
        transform: Transform | None = None,
    ) -> None:
        for name, value in (
            ("num_classes", num_classes),
            ("images_per_class", images_per_class),
            ("image_size", image_size),
            ("channels", channels),
            ("rank", rank),
        ):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if seed < 0 or not math.isfinite(difficulty) or difficulty < 0:
            raise ValueError(
                f"need seed >= 0 and a finite difficulty >= 0, got {seed}, {difficulty}"
            )
        labels = np.repeat(np.arange(num_classes, dtype=np.int64), images_per_class)
        super().__init__(labels, num_classes, None, transform)
        self.images_per_class = images_per_class
        self.image_size = image_size
        self.channels = channels
        self.seed = seed
        self.difficulty = float(difficulty)
        self.rank = rank
        self.basis = self._make_basis()  # (rank, C * S * S) float32
        # the products with float64 codes cast the basis to float64 anyway: once, here (exact)
        self._basis64 = self.basis.astype(np.float64)

    def _make_basis(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 0])
        low = max(2, self.image_size // 4)
        coarse = torch.from_numpy(
            rng.standard_normal((self.rank, self.channels, low, low), dtype=np.float32)
        )
        smooth = F.interpolate(
            coarse, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False
        ).flatten(1)
        smooth = smooth / smooth.pow(2).mean(dim=1, keepdim=True).sqrt()
        return smooth.numpy()

    def class_code(self, label: int) -> np.ndarray:
        """Code ``z_c`` of class ``label``, shape ``(rank,)``."""
        return np.random.default_rng([self.seed, 1, int(label)]).standard_normal(self.rank)

    def prototype(self, label: int) -> torch.Tensor:
        """The nuisance-free image of class ``label``, ``(C, S, S)`` in (0, 1)."""
        signal = self.class_code(label) @ self.basis / math.sqrt(self.rank)
        return torch.sigmoid(torch.from_numpy(signal.astype(np.float32))).view(
            self.channels, self.image_size, self.image_size
        )

    def _draws(self, index: int):
        """Row ``index``'s own draws: ``(code, shift, contrast, brightness, noise)``."""
        rng = np.random.default_rng([self.seed, 2, int(index)])
        d, size = self.difficulty, self.image_size
        code = self.class_code(int(self.labels[index])) + 0.9 * d * rng.standard_normal(self.rank)
        max_shift = int(round(d * size / 8))
        shift = rng.integers(-max_shift, max_shift + 1, size=2)
        contrast = math.exp(0.3 * d * rng.standard_normal())
        brightness = 0.5 * d * rng.standard_normal()
        noise = 0.5 * d * rng.standard_normal((self.channels, size, size))
        return code, shift, contrast, brightness, noise

    def load_image(self, index: int) -> torch.Tensor:
        return self.load_batch(np.array([index]))[0]

    def load_batch(self, indices: np.ndarray) -> torch.Tensor:
        """Each row from its own seeded draws, rendered in place into one float32 batch (no
        per-image tensors); the same pixels as rendering it alone, whatever the batch."""
        c, s = self.channels, self.image_size
        out = np.empty((len(indices), c, s, s), dtype=np.float32)
        for k, index in enumerate(indices):
            code, shift, contrast, brightness, noise = self._draws(index)
            signal = (code @ self._basis64 / math.sqrt(self.rank)).reshape(c, s, s)
            signal = np.roll(signal, (int(shift[0]), int(shift[1])), axis=(1, 2))
            signal *= contrast
            signal += brightness
            signal += noise
            out[k] = signal
        images = torch.from_numpy(out)
        for image in images:  # one image at a time: the rounding of sigmoid alone on it
            torch.sigmoid(image, out=image)
        return images
