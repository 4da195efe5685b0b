"""SimCLR side-information model (Chen et al. 2020; FCT sec. 3.4 and appendix G).

``psi(x)`` is a backbone embedding of 64-128 dims followed by an extra BatchNorm1d (FCT's
"ResNet + extra BN on the output"); a projection MLP on top is used only by the NT-Xent loss.
Trained without labels on the data available at old-model time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SimCLRSideInfo(nn.Module):
    def __init__(self, backbone: nn.Module, projection_dim: int = 128) -> None:
        super().__init__()
        self.backbone = backbone
        self.embed_dim = backbone.embed_dim
        self.output_norm = nn.BatchNorm1d(self.embed_dim)
        self.projection = nn.Sequential(
            nn.Linear(self.embed_dim, self.embed_dim),
            nn.ReLU(inplace=True),
            nn.Linear(self.embed_dim, projection_dim),
        )

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, embed_dim)`` side-information."""
        return self.output_norm(self.backbone.forward_features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.forward_features(x))


def nt_xent_loss(
    z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.1
) -> dict[str, torch.Tensor]:
    """NT-Xent over the 2B views: each view's positive is its twin, the other 2B-2 are negatives.

    Args:
        z1, z2: ``(B, p)`` projections of two augmentations of the same B images.
    """
    if z1.shape != z2.shape or z1.shape[0] < 2:
        raise ValueError(
            f"nt_xent_loss needs two (B>=2, p) views of equal shape, got "
            f"{tuple(z1.shape)} and {tuple(z2.shape)}"
        )
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / temperature
    n = z1.shape[0]
    sim.fill_diagonal_(float("-inf"))
    positives = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    loss = F.cross_entropy(sim, positives)
    return {"nt_xent": loss, "loss": loss}


def simclr_views(
    images: torch.Tensor, generator: torch.Generator | None = None, crop_scale: float = 0.5
) -> torch.Tensor:
    """One random view per image: random resized crop, horizontal flip, brightness/contrast jitter.

    Pure tensor ops on ``(B, C, H, W)`` in [0, 1], so it runs on any device inside the loop.
    """
    b, _, h, w = images.shape
    dev = images.device
    scale = crop_scale + (1 - crop_scale) * torch.rand(b, generator=generator).to(dev)
    shift = (1 - scale)[:, None] * (2 * torch.rand(b, 2, generator=generator).to(dev) - 1)
    theta = torch.zeros(b, 2, 3, device=dev)
    flip = torch.where(torch.rand(b, generator=generator).to(dev) < 0.5, -1.0, 1.0)
    theta[:, 0, 0] = scale * flip
    theta[:, 1, 1] = scale
    theta[:, :, 2] = shift
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    view = F.grid_sample(images, grid, padding_mode="reflection", align_corners=False)
    brightness = 0.8 + 0.4 * torch.rand(b, 1, 1, 1, generator=generator).to(dev)
    contrast = 0.8 + 0.4 * torch.rand(b, 1, 1, 1, generator=generator).to(dev)
    mean = view.mean(dim=(1, 2, 3), keepdim=True)
    return ((view - mean) * contrast + mean * brightness).clamp(0, 1)
