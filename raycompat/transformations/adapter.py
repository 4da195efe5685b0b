"""The ``"adapter"`` kind: a linear map plus a small residual MLP, Drift-Adapter style.

``h(x) = x A + b + MLP(x)``, ``MLP = Linear(d_old, width) -> GELU -> Linear(width, d_new)``
(Vejendla, "Drift-Adapter", EMNLP 2025, arXiv 2509.23471, its residual-MLP adapter). ``A`` and
``b`` are a closed-form fit (Procrustes or least squares, :mod:`raycompat.transformations.fit`)
and stay fixed; the MLP's last layer starts at zero, so the adapter starts exactly at that fit
and its training (AdamW early stopped on held-out pairs,
:func:`~raycompat.transformations.fit.fit_adapter`) learns only what the linear map leaves.
No side-information (``d_side = 0``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from raycompat.transformations.linear import LinearMap


class AdapterTransformation(LinearMap):
    """``forward(old (N, d_old)) -> old @ weight + bias + mlp(old) (N, d_new)``."""

    kind = "adapter"
    spec_keys = ("d_old", "d_side", "d_new", "width", "normalize_output")

    def __init__(
        self,
        d_old: int,
        d_new: int,
        d_side: int = 0,
        width: int = 256,
        normalize_output: bool = False,
    ) -> None:
        super().__init__(d_old, d_new, d_side, normalize_output)
        self.mlp = nn.Sequential(nn.Linear(d_old, width), nn.GELU(), nn.Linear(width, d_new))
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "width": self.mlp[0].out_features}

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.linear(old, side) + self.mlp(old))
