"""ImageNet-style ResNet-18 / ResNet-50 (He et al., CVPR 2016) from torchvision, randomly
initialised (``weights=None``: nothing is downloaded).

Used by CoReS on CASIA-WebFace (ResNet-50 at 112x112), by FCT (ResNet50-128 / ResNet18-128: "the
penultimate layer modified to output 128 dimensions") and by NI-FCL. The classification layer
``fc`` is replaced by the embedding layer: ``Linear(native, embed_dim)``, or the identity when
``embed_dim`` is None (native pooled width 512 for ResNet-18, 2048 for ResNet-50). The adaptive
average pool makes any input size from 32x32 up work (112x112 gives a 4x4 last feature map), and
the network runs unchanged in ``memory_format=torch.channels_last``.
"""

from __future__ import annotations

import torch
from torch import nn

_ARCHS = ("resnet18", "resnet34", "resnet50", "resnet101")


class TorchvisionResNet(nn.Module):
    """Input ``(B, in_chans, H, W)`` -> ``(B, embed_dim)``."""

    def __init__(
        self,
        arch: str,
        embed_dim: int | None = None,
        in_chans: int = 3,
        zero_init_residual: bool = False,
    ) -> None:
        super().__init__()
        self.in_chans, self.image_size = in_chans, None  # any size (global pooling)
        if arch not in _ARCHS:
            raise ValueError(f"unknown torchvision ResNet {arch!r}; valid: {', '.join(_ARCHS)}")
        import torchvision.models as tvm

        trunk = getattr(tvm, arch)(weights=None, zero_init_residual=zero_init_residual)
        if in_chans != 3:
            old = trunk.conv1
            trunk.conv1 = nn.Conv2d(
                in_chans, old.out_channels, old.kernel_size, old.stride, old.padding, bias=False
            )
            nn.init.kaiming_normal_(trunk.conv1.weight, mode="fan_out", nonlinearity="relu")
        native = trunk.fc.in_features
        trunk.fc = nn.Identity() if embed_dim is None else nn.Linear(native, embed_dim)
        self.trunk = trunk
        self.arch = arch
        self.embed_dim = native if embed_dim is None else embed_dim

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)
