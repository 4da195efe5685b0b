"""Side-information models for FCT (sec. 5.1): ``simclr``, ``alternate_model`` (a second old
model trained with another seed), ``none`` (zeros). Each exposes ``embed_dim`` and
``forward_features(x)``.
"""

from __future__ import annotations

import torch
from torch import nn

from raycompat.nn.backbones import create_backbone
from raycompat.nn.side_info.simclr import SimCLRSideInfo, nt_xent_loss, simclr_views
from raycompat.registry import Registry

SIDE_INFO: Registry[nn.Module] = Registry("side-information model")


class NoSideInfo(nn.Module):
    """psi(x) = 0 (FCT's "no side-information" baseline); width 0 removes the branch."""

    def __init__(self, embed_dim: int = 0) -> None:
        super().__init__()
        self.embed_dim = embed_dim

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(x.shape[0], self.embed_dim)


@SIDE_INFO.register("simclr")
def simclr(
    *,
    backbone: str,
    embed_dim: int = 128,
    projection_dim: int = 128,
    backbone_kwargs: dict | None = None,
) -> nn.Module:
    net = create_backbone(backbone, embed_dim=embed_dim, **(backbone_kwargs or {}))
    return SimCLRSideInfo(net, projection_dim=projection_dim)


@SIDE_INFO.register("alternate_model")
def alternate_model(
    *, backbone: str, embed_dim: int = 128, backbone_kwargs: dict | None = None
) -> nn.Module:
    return create_backbone(backbone, embed_dim=embed_dim, **(backbone_kwargs or {}))


@SIDE_INFO.register("none")
def none(*, embed_dim: int = 0, **_ignored) -> nn.Module:
    return NoSideInfo(embed_dim)


def create_side_info(name: str, **kwargs) -> nn.Module:
    return SIDE_INFO.create(name, **kwargs)


__all__ = [
    "SIDE_INFO",
    "NoSideInfo",
    "SimCLRSideInfo",
    "create_side_info",
    "nt_xent_loss",
    "simclr_views",
]
