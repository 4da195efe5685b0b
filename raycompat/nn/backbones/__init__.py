"""Backbone registry. Every backbone exposes ``embed_dim`` and ``forward_features(x)``.

Builders take keyword arguments only; ``embed_dim`` sets the embedding width (an embedding layer
is added on top of the architecture's native pooled width where needed).
"""

from __future__ import annotations

from torch import nn

from raycompat.registry import Registry

BACKBONES: Registry[nn.Module] = Registry("backbone")


def create_backbone(name: str, **kwargs) -> nn.Module:
    return BACKBONES.create(name, **kwargs)


def list_backbones() -> list[str]:
    return BACKBONES.names()


@BACKBONES.register("lenetpp")
def lenetpp(*, embed_dim: int = 2, in_chans: int = 1, image_size: int = 28) -> nn.Module:
    from raycompat.nn.backbones.lenetpp import LeNetPP

    return LeNetPP(embed_dim=embed_dim, in_chans=in_chans, image_size=image_size)


@BACKBONES.register("cifar_resnet20")
def cifar_resnet20(
    *, embed_dim: int | None = None, in_chans: int = 3, shortcut: str = "A"
) -> nn.Module:
    from raycompat.nn.backbones.cifar_resnet import CifarResNet

    return CifarResNet(20, embed_dim=embed_dim, in_chans=in_chans, shortcut=shortcut)


@BACKBONES.register("cifar_resnet32")
def cifar_resnet32(
    *, embed_dim: int | None = None, in_chans: int = 3, shortcut: str = "A"
) -> nn.Module:
    from raycompat.nn.backbones.cifar_resnet import CifarResNet

    return CifarResNet(32, embed_dim=embed_dim, in_chans=in_chans, shortcut=shortcut)


@BACKBONES.register("senet18")
def senet18(
    *,
    embed_dim: int | None = None,
    in_chans: int = 3,
    base_width: int = 64,
    preact: bool = True,
    reduction: int = 16,
) -> nn.Module:
    from raycompat.nn.backbones.senet import SENet18

    return SENet18(
        embed_dim=embed_dim,
        in_chans=in_chans,
        base_width=base_width,
        preact=preact,
        reduction=reduction,
    )


@BACKBONES.register("resnet18")
def resnet18(
    *, embed_dim: int | None = None, in_chans: int = 3, zero_init_residual: bool = False
) -> nn.Module:
    from raycompat.nn.backbones.torchvision_resnet import TorchvisionResNet

    return TorchvisionResNet(
        "resnet18", embed_dim=embed_dim, in_chans=in_chans, zero_init_residual=zero_init_residual
    )


@BACKBONES.register("resnet50")
def resnet50(
    *, embed_dim: int | None = None, in_chans: int = 3, zero_init_residual: bool = False
) -> nn.Module:
    from raycompat.nn.backbones.torchvision_resnet import TorchvisionResNet

    return TorchvisionResNet(
        "resnet50", embed_dim=embed_dim, in_chans=in_chans, zero_init_residual=zero_init_residual
    )


def _dinov3(variant: str):
    def build(**kwargs) -> nn.Module:
        """DINOv3 ViT (timm, pretrained=False); keyword arguments as :class:`DINOv3Backbone`."""
        from raycompat.nn.backbones.dinov3 import DINOv3Backbone

        return DINOv3Backbone(variant, **kwargs)

    return build


for _variant in ("vits16", "vitb16"):
    BACKBONES.register(f"dinov3_{_variant}")(_dinov3(_variant))
