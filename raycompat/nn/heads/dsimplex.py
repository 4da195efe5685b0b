"""Fixed d-Simplex classifier (CoReS, Biondi et al. TPAMI 2023, sec. 5.1; d-Simplex-HOC).

K classes live on the vertices of a regular simplex in d = K - 1 dimensions. The prototype
matrix is built from ``V = [I_{K-1}; a 1^T]`` with ``a = (1 - sqrt(K)) / (K - 1)``, centred by
subtracting its column mean and with every row L2-normalised (REFERENCE.md). Every pairwise
cosine is then exactly ``-1/(K-1)``.

Because ``W`` is a centred identity plus one constant row, ``f W^T`` has a closed form that costs
O(B*K) time and memory: for the first K-1 prototypes ``(f_i - m * sum(f)) / n`` and for the last
``(a - m) * sum(f) / n_last``, where ``m = (1 + a) / K`` is the common column mean. The K x (K-1)
matrix is never built, which is what makes K = 22000 (CelebA in IAM-CL2R) fit on a GPU.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _simplex_constants(num_classes: int) -> tuple[float, float, float, float]:
    """Return ``(a, m, n, n_last)``: last-row constant, column mean and the two row norms."""
    if num_classes < 2:
        raise ValueError(f"a d-Simplex needs at least 2 classes, got {num_classes}")
    k = num_classes
    a = (1.0 - math.sqrt(k)) / (k - 1)
    m = (1.0 + a) / k
    n = math.sqrt((1.0 - m) ** 2 + (k - 2) * m**2)
    n_last = abs(a - m) * math.sqrt(k - 1)
    return a, m, n, n_last


def dsimplex_prototypes(num_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dense d-Simplex prototypes.

    Args:
        num_classes: K >= 2.
    Returns:
        ``(K, K-1)`` tensor with unit rows, pairwise cosine ``-1/(K-1)`` and rows summing to 0.
    """
    a, _, _, _ = _simplex_constants(num_classes)
    k = num_classes
    v = torch.cat(
        [torch.eye(k - 1, dtype=torch.float64), torch.full((1, k - 1), a, dtype=torch.float64)]
    )
    v = v - v.mean(dim=0, keepdim=True)
    v = v / v.norm(dim=1, keepdim=True)
    return v.to(dtype)


def dsimplex_logits(features: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Closed-form ``features @ dsimplex_prototypes(K).T`` in O(B*K).

    Args:
        features: ``(B, K-1)``.
    Returns:
        ``(B, K)`` logits.
    """
    if features.ndim != 2 or features.shape[1] != num_classes - 1:
        raise ValueError(
            f"d-Simplex with K={num_classes} expects features of shape (B, {num_classes - 1}), "
            f"got {tuple(features.shape)}"
        )
    a, m, n, n_last = _simplex_constants(num_classes)
    total = features.sum(dim=1, keepdim=True)
    first = (features - m * total) / n
    last = (a - m) * total / n_last
    return torch.cat([first, last], dim=1)


def polygon_prototypes(num_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Regular K-gon in 2-D: the fixed classifier CoReS draws for 2-D MNIST features (Fig. 7c).

    Returns:
        ``(K, 2)`` unit rows at angles ``2*pi*i/K``.
    """
    if num_classes < 2:
        raise ValueError(f"a polygon classifier needs at least 2 classes, got {num_classes}")
    angles = 2 * math.pi * torch.arange(num_classes, dtype=torch.float64) / num_classes
    return torch.stack([angles.cos(), angles.sin()], dim=1).to(dtype)


def allocate_labels(labels: torch.Tensor, num_classes: int, order: str = "ltr") -> torch.Tensor:
    """Map class labels to prototype indices.

    ``ltr`` (CoReS, CL2R): class y -> prototype y. ``rtl`` (IAM-CL2R fine-tuning classes):
    class y -> prototype K-1-y, so that a replacement model pre-trained left-to-right elsewhere
    shares the same fixed interface.
    """
    if order == "ltr":
        mapped = labels
    elif order == "rtl":
        mapped = num_classes - 1 - labels
    else:
        raise ValueError(f"unknown label allocation {order!r}; valid: ltr, rtl")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"labels span [{int(labels.min())}, {int(labels.max())}] but the classifier has only "
            f"K={num_classes} outputs; pre-allocate a larger K"
        )
    return mapped


class FixedClassifier(nn.Module):
    """A non-trainable classifier: logits over ALL K outputs (future classes included).

    Prototypes are a buffer, so no optimiser ever sees them and no gradient reaches them.
    """

    fixed = True

    def __init__(self, prototypes: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("prototypes", prototypes, persistent=True)
        self.num_classes, self.feature_dim = prototypes.shape

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features @ self.prototypes.T

    def weight_matrix(self) -> torch.Tensor:
        return self.prototypes


class DSimplexClassifier(nn.Module):
    """d-Simplex fixed classifier with closed-form logits (no K x (K-1) matrix held).

    Args:
        num_classes: K, the number of pre-allocated outputs; the feature width must be K-1.
        closed_form: if False, materialise the dense prototypes and use a matmul (for checks).
    """

    fixed = True

    def __init__(self, num_classes: int, closed_form: bool = True) -> None:
        super().__init__()
        _simplex_constants(num_classes)
        self.num_classes = num_classes
        self.feature_dim = num_classes - 1
        self.closed_form = closed_form
        if not closed_form:
            self.register_buffer("prototypes", dsimplex_prototypes(num_classes), persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.closed_form:
            return dsimplex_logits(features, self.num_classes)
        return features @ self.prototypes.T

    def weight_matrix(self) -> torch.Tensor:
        return dsimplex_prototypes(self.num_classes)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, closed_form={self.closed_form}"
