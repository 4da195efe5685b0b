"""The one model interface: ``forward_features(x)`` -> embedding, ``forward_head(f)`` -> logits.

A :class:`CompatModel` is a backbone (any module with ``embed_dim`` and ``forward_features``)
plus a classifier head from :mod:`raycompat.nn.heads`. The embedding is what goes to the gallery;
the head is only used in training.
"""

from __future__ import annotations

import torch
from torch import nn

from raycompat.nn.backbones import create_backbone
from raycompat.nn.heads import create_head


class CompatModel(nn.Module):
    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        if head.feature_dim != backbone.embed_dim:
            raise ValueError(
                f"head expects features of width {head.feature_dim} but the backbone produces "
                f"{backbone.embed_dim}"
            )
        self.backbone = backbone
        self.head = head

    @property
    def embed_dim(self) -> int:
        return self.backbone.embed_dim

    @property
    def num_classes(self) -> int:
        return self.head.num_classes

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` images -> ``(B, embed_dim)`` embeddings (un-normalised)."""
        return self.backbone.forward_features(x)

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        """``(B, embed_dim)`` -> ``(B, num_classes)`` logits."""
        return self.head(features)

    def forward(self, x: torch.Tensor, output: str = "logits"):
        """``output``: ``"logits"``, ``"features"`` or ``"both"`` (a ``(features, logits)`` pair).

        Training code calls the model through ``forward`` only, because DDP, FSDP2 and DeepSpeed
        hook ``forward``: calling ``forward_features`` on a wrapped model would skip gradient
        synchronisation or parameter all-gathers.
        """
        features = self.forward_features(x)
        if output == "features":
            return features
        logits = self.forward_head(features)
        if output == "logits":
            return logits
        if output == "both":
            return features, logits
        raise ValueError(f"output must be 'logits', 'features' or 'both', got {output!r}")


def features_and_logits(model: nn.Module, images: torch.Tensor):
    """``(features, logits)`` through ``model.forward``, so that it works on wrapped models."""
    return model(images, output="both")


def create_model(
    backbone: str,
    head: str,
    num_classes: int,
    embed_dim: int | None = None,
    backbone_kwargs: dict | None = None,
    head_kwargs: dict | None = None,
) -> CompatModel:
    """Build backbone + head by registered names.

    For a ``dsimplex`` head the embedding width is forced to K-1 (the simplex's dimension); for
    ``polygon`` to 2. Otherwise ``embed_dim`` (or the backbone's default) is used.
    """
    fixed_width = {"dsimplex": num_classes - 1, "polygon": 2}.get(head)
    if fixed_width is not None and embed_dim not in (None, fixed_width):
        raise ValueError(
            f"head {head!r} with K={num_classes} fixes the embedding width to {fixed_width}, "
            f"but embed_dim={embed_dim} was asked for"
        )
    width = fixed_width if fixed_width is not None else embed_dim
    kwargs = dict(backbone_kwargs or {})
    if width is not None:
        kwargs["embed_dim"] = width
    net = create_backbone(backbone, **kwargs)
    classifier = create_head(
        head, feature_dim=net.embed_dim, num_classes=num_classes, **(head_kwargs or {})
    )
    return CompatModel(net, classifier)
