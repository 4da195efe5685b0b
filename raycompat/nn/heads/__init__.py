"""Classifier heads: learnable linear, fixed d-Simplex (closed form), fixed 2-D polygon.

Every head maps ``(B, feature_dim)`` features to ``(B, num_classes)`` logits, exposes
``feature_dim``, ``num_classes``, ``fixed`` and ``weight_matrix()`` (dense ``(K, d)``, for
methods such as BCT that need the rows).
"""

from __future__ import annotations

from torch import nn

from raycompat.nn.heads.dsimplex import (
    DSimplexClassifier,
    FixedClassifier,
    allocate_labels,
    dsimplex_logits,
    dsimplex_prototypes,
    polygon_prototypes,
)
from raycompat.nn.heads.linear import LinearClassifier
from raycompat.registry import Registry

HEADS: Registry[nn.Module] = Registry("head")


@HEADS.register("linear")
def linear(
    *, feature_dim: int, num_classes: int, bias: bool = True, normalize_weight: bool = False
) -> nn.Module:
    return LinearClassifier(feature_dim, num_classes, bias=bias, normalize_weight=normalize_weight)


@HEADS.register("dsimplex")
def dsimplex(*, feature_dim: int, num_classes: int, closed_form: bool = True) -> nn.Module:
    if feature_dim != num_classes - 1:
        raise ValueError(
            f"a d-Simplex head with K={num_classes} classes needs feature_dim={num_classes - 1}, "
            f"got {feature_dim}"
        )
    return DSimplexClassifier(num_classes, closed_form=closed_form)


@HEADS.register("polygon")
def polygon(*, feature_dim: int, num_classes: int) -> nn.Module:
    if feature_dim != 2:
        raise ValueError(
            f"the polygon head is the fixed 2-D classifier; got feature_dim={feature_dim}"
        )
    return FixedClassifier(polygon_prototypes(num_classes))


def create_head(name: str, **kwargs) -> nn.Module:
    return HEADS.create(name, **kwargs)


def list_heads() -> list[str]:
    return HEADS.names()


__all__ = [
    "HEADS",
    "DSimplexClassifier",
    "FixedClassifier",
    "LinearClassifier",
    "allocate_labels",
    "create_head",
    "dsimplex_logits",
    "dsimplex_prototypes",
    "list_heads",
    "polygon_prototypes",
]
