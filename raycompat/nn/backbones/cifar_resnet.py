"""CIFAR ResNet-20/32 (He et al., CVPR 2016, section 4.2), used in the CoReS architecture ablation
(Sec. 8.5, Fig. 10: 0.27M and 0.46M parameters).

A 3x3 stem of 16 channels, then three stages of ``n`` basic blocks with 16, 32 and 64 channels
(depth = 6n + 2), global average pooling: native width 64.

Shortcuts: option **A** by default, as in He et al.'s CIFAR experiments and in the ResNet-32 code
CoReS cites (parameter-free: the identity, subsampled by 2 and zero-padded on the new channels,
where a stage changes width); it is what gives the 0.27M / 0.46M counts the paper quotes.
Option **B** (1x1 convolution + BN projection where the width changes) is available as
``shortcut="B"``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

STAGE_WIDTHS = (16, 32, 64)


class _ZeroPadShortcut(nn.Module):
    """Option A: ``(B, C, H, W)`` -> ``(B, C_out, H/2, W/2)`` by subsampling and zero channels."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.stride, self.extra = stride, c_out - c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra))


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, shortcut: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        if stride == 1 and c_in == c_out:
            self.shortcut: nn.Module = nn.Identity()
        elif shortcut == "A":
            self.shortcut = _ZeroPadShortcut(c_in, c_out, stride)
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """Input ``(B, in_chans, 32, 32)`` -> ``(B, embed_dim)``.

    ``embed_dim=None`` returns the pooled 64-d feature; otherwise a linear embedding layer maps it
    to ``embed_dim`` (e.g. K-1 for a d-Simplex head).
    """

    def __init__(
        self, depth: int, embed_dim: int | None = None, in_chans: int = 3, shortcut: str = "A"
    ) -> None:
        super().__init__()
        self.in_chans, self.image_size = in_chans, 32  # CIFAR input
        if (depth - 2) % 6 != 0 or depth < 8:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2 with n >= 1, got {depth}")
        if shortcut not in ("A", "B"):
            raise ValueError(f"shortcut must be 'A' or 'B', got {shortcut!r}")
        n = (depth - 2) // 6
        self.stem = nn.Sequential(
            nn.Conv2d(in_chans, STAGE_WIDTHS[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(STAGE_WIDTHS[0]),
            nn.ReLU(inplace=True),
        )
        blocks, c_in = [], STAGE_WIDTHS[0]
        for stage, c_out in enumerate(STAGE_WIDTHS):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(c_in, c_out, stride, shortcut))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        native = STAGE_WIDTHS[-1]
        self.embedding = nn.Identity() if embed_dim is None else nn.Linear(native, embed_dim)
        self.embed_dim = native if embed_dim is None else embed_dim
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding(self.pool(self.blocks(self.stem(x))).flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)
