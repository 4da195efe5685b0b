"""SENet-18 for 32x32 inputs: the CoReS main CIFAR architecture (Sec. 7.3, footnote 4 cites
kuangliu/pytorch-cifar).

ResNet-18 layout (3x3 stem of 64 channels, four stages of two basic blocks with 64/128/256/512
channels, strides 1/2/2/2) with squeeze-and-excitation (Hu et al., CVPR 2018) on every block:
``w = sigmoid(W2 relu(W1 avgpool(r)))`` rescales the residual branch ``r`` channel-wise before
it is added to the shortcut. Reduction 16. Global average pooling: native width 512.

As in the cited code, ``SENet18`` uses *pre-activation* blocks (BN-ReLU before each conv, 1x1
projection shortcut without BN, no ReLU after the addition and no final BN-ReLU); ``preact=False``
gives post-activation basic blocks (conv-BN-ReLU, projection with BN, ReLU after the addition).
Note: the paper quotes 1.23M parameters for its SENet-18, while the cited layout has ~11.3M;
``base_width`` scales every stage (64 -> ~11.3M, 20 -> ~1.1M) should that count be wanted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SqueezeExcite(nn.Module):
    """``(B, C, H, W)`` -> same shape, rescaled by per-channel gates in (0, 1)."""

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        hidden = max(channels // reduction, 1)
        self.fc1 = nn.Conv2d(channels, hidden, 1)
        self.fc2 = nn.Conv2d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.fc2(F.relu(self.fc1(w))))


class SEBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, preact: bool, reduction: int) -> None:
        super().__init__()
        self.preact = preact
        self.bn1 = nn.BatchNorm2d(c_in if preact else c_out)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.se = SqueezeExcite(c_out, reduction)
        self.shortcut: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            proj = [nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)]
            self.shortcut = (
                nn.Sequential(*proj) if preact else nn.Sequential(*proj, nn.BatchNorm2d(c_out))
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.preact:
            out = F.relu(self.bn1(x))
            identity = x if self.shortcut is None else self.shortcut(out)
            out = self.conv2(F.relu(self.bn2(self.conv1(out))))
            return self.se(out) + identity
        identity = x if self.shortcut is None else self.shortcut(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(self.se(out) + identity)


class SENet18(nn.Module):
    """Input ``(B, in_chans, 32, 32)`` -> ``(B, embed_dim)``; ``embed_dim=None`` -> 8*base_width."""

    def __init__(
        self,
        embed_dim: int | None = None,
        in_chans: int = 3,
        base_width: int = 64,
        preact: bool = True,
        reduction: int = 16,
    ) -> None:
        super().__init__()
        widths = [base_width * m for m in (1, 2, 4, 8)]
        self.stem = nn.Sequential(
            nn.Conv2d(in_chans, widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        blocks, c_in = [], widths[0]
        for stage, c_out in enumerate(widths):
            for i in range(2):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(SEBlock(c_in, c_out, stride, preact, reduction))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        native = widths[-1]
        self.embedding = nn.Identity() if embed_dim is None else nn.Linear(native, embed_dim)
        self.embed_dim = native if embed_dim is None else embed_dim

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(self.stem(x))
        return self.embedding(F.adaptive_avg_pool2d(out, 1).flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)
