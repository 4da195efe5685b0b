"""Learnable linear classifier.

With ``normalize_weight=True`` and no bias, logits are ``f W^T / ||w_i||``: the setting CoReS
uses for its LeNet++ MNIST figures ("classifier weights and biases are unit normalized and set
to zero", sec. 5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LinearClassifier(nn.Module):
    fixed = False

    def __init__(
        self, feature_dim: int, num_classes: int, bias: bool = True, normalize_weight: bool = False
    ) -> None:
        super().__init__()
        if normalize_weight and bias:
            raise ValueError("normalize_weight=True implies bias=False (CoReS LeNet++ setting)")
        self.feature_dim = feature_dim
        self.num_classes = num_classes
        self.normalize_weight = normalize_weight
        self.fc = nn.Linear(feature_dim, num_classes, bias=bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.normalize_weight:
            return F.linear(features, F.normalize(self.fc.weight, dim=1))
        return self.fc(features)

    def weight_matrix(self) -> torch.Tensor:
        w = self.fc.weight
        return F.normalize(w, dim=1) if self.normalize_weight else w
