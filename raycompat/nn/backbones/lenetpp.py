"""LeNet++ (Wen et al., ECCV 2016): the deeper, wider LeNet used with a 2-D feature space in the
CoReS MNIST figures (Fig. 2, Fig. 7).

Three stages of two 5x5 convolutions with PReLU, each followed by 2x2 max-pooling, then a linear
layer to ``embed_dim`` (2 in the papers). The embedding is the linear output, with no activation,
so that features may point in every direction of the plane (a fixed polygon classifier needs it).
"""

from __future__ import annotations

import torch
from torch import nn


def _stage(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 5, padding=2),
        nn.PReLU(),
        nn.Conv2d(c_out, c_out, 5, padding=2),
        nn.PReLU(),
        nn.MaxPool2d(2, ceil_mode=True),
    )


class LeNetPP(nn.Module):
    """Input ``(B, in_chans, 28, 28)`` -> ``(B, embed_dim)``."""

    def __init__(self, embed_dim: int = 2, in_chans: int = 1, image_size: int = 28) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.in_chans, self.image_size = in_chans, image_size  # the input it was built for
        self.features = nn.Sequential(_stage(in_chans, 32), _stage(32, 64), _stage(64, 128))
        side = image_size
        for _ in range(3):
            side = -(-side // 2)
        self.embedding = nn.Linear(128 * side * side, embed_dim)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding(self.features(x).flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)
