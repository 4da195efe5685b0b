"""``raycompat.engine.embed``: the one feature extraction, normalised only when asked."""

from __future__ import annotations

import torch
from torch import nn

from raycompat.cluster.pipelines.extract import embed as pipeline_embed
from raycompat.engine import embed, extract_features


class Linear(nn.Module):
    embed_dim = 3

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.flatten(1))


def test_embed_normalises_only_when_asked_and_every_caller_agrees():
    torch.manual_seed(0)
    model, images = Linear().eval(), torch.randn(5, 1, 2, 2)
    raw = embed(model.forward_features, images, normalize=False)
    unit = embed(model.forward_features, images, normalize=True)
    assert raw.dtype == torch.float32 and not raw.requires_grad
    torch.testing.assert_close(unit, raw / raw.norm(dim=1, keepdim=True))
    torch.testing.assert_close(extract_features(model, images, batch_size=2), raw)
    torch.testing.assert_close(pipeline_embed(model, images, None, True), unit)
