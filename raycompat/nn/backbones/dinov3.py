"""DINOv3 ViT-S/16 and ViT-B/16 (Simeoni et al., 2025) through timm, for the "stronger
architecture" replacement models of IAM-CL2R-style upgrades.

The trunk is ``timm.create_model(variant, pretrained=False, num_classes=0)``: timm never fetches
anything. Pretrained weights, when wanted, are a file the user names (``weights``: local path or
``s3://`` URI, read by :mod:`raycompat.io.weights`); both timm-format state dicts and Meta's
original
DINOv3 checkpoints (recognised by their ``storage_tokens`` key, converted with timm's own
``checkpoint_filter_fn``) are accepted. The feature is the pooled token: ``global_pool="token"``
(the final-norm CLS token, as upstream DINOv3) by default; timm's own default is ``"avg"``.
An optional linear embedding layer maps the trunk width (384 / 768) to ``embed_dim``.
RoPE position embeddings make any ``img_size`` divisible by 16 work (``img_size`` only sets the
default grid).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from raycompat.io.weights import load_state_dict, load_state_dict_into

logger = logging.getLogger(__name__)

VARIANTS = {"vits16": "vit_small_patch16_dinov3", "vitb16": "vit_base_patch16_dinov3"}


class DINOv3Backbone(nn.Module):
    """Input ``(B, in_chans, H, W)`` with H, W multiples of 16 -> ``(B, embed_dim)``."""

    def __init__(
        self,
        variant: str,
        embed_dim: int | None = None,
        in_chans: int = 3,
        img_size: int = 224,
        global_pool: str = "token",
        drop_path_rate: float = 0.0,
        weights: str | None = None,
        strict: bool = True,
        storage_options: dict | None = None,
    ) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown DINOv3 variant {variant!r}; valid: {', '.join(VARIANTS)}")
        if img_size % 16:
            raise ValueError(f"img_size must be a multiple of the patch size 16, got {img_size}")
        import timm

        self.trunk = timm.create_model(
            VARIANTS[variant],
            pretrained=False,
            num_classes=0,
            in_chans=in_chans,
            img_size=img_size,
            global_pool=global_pool,
            drop_path_rate=drop_path_rate,
        )
        if weights is not None:
            self.load_trunk_weights(weights, strict=strict, storage_options=storage_options)
        native = self.trunk.num_features
        self.embedding = nn.Identity() if embed_dim is None else nn.Linear(native, embed_dim)
        self.embed_dim = native if embed_dim is None else embed_dim

    def load_trunk_weights(
        self, uri: str, strict: bool = True, storage_options: dict | None = None
    ) -> None:
        """Load a timm-format or Meta-format DINOv3 state dict from ``uri`` into the trunk."""
        state = load_state_dict(uri, storage_options)
        if "storage_tokens" in state:
            from timm.models.eva import checkpoint_filter_fn

            logger.debug("converting Meta DINOv3 checkpoint %s to timm names", uri)
            state = checkpoint_filter_fn(state, self.trunk)
        load_state_dict_into(self.trunk, state, source=str(uri), strict=strict)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding(self.trunk(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)
