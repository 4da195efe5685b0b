"""The registry of transformation kinds, readable without torch.

Each kind is a :class:`~raycompat.transformations.base.Transformation` subclass registered by
``"module:Class"`` and imported at its first use, so a config check can list the kinds and
check a name without importing torch. :func:`create_transformation` builds one from its
constructor spec; :mod:`raycompat.transformations.files` saves and loads one by the ``kind`` its
stored spec records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raycompat.registry import Registry

if TYPE_CHECKING:
    from raycompat.transformations.base import Transformation

TRANSFORMATIONS: Registry[Transformation] = Registry("transformation kind")
# FCT's h and g (Ramanujan et al., CVPR 2022), FastFill's uncertainty head optional.
TRANSFORMATIONS.register_path("fct", "raycompat.transformations.fct:FCTTransformation")
# Fitted without training on paired rows (raycompat.transformations.fit); no side-information.
# Orthogonal Procrustes (Schoenemann 1966).
TRANSFORMATIONS.register_path(
    "procrustes", "raycompat.transformations.linear:ProcrustesTransformation"
)
# Least squares with the lambda-orthogonality penalty (Ricci et al., arXiv 2509.16664).
TRANSFORMATIONS.register_path("affine", "raycompat.transformations.linear:AffineTransformation")
# A fixed linear map plus a residual MLP (Drift-Adapter, arXiv 2509.23471).
TRANSFORMATIONS.register_path("adapter", "raycompat.transformations.adapter:AdapterTransformation")
# Procrustes, then spherical interpolation (Ricci, Biondi, Pernici, NeurIPS 2026).
TRANSFORMATIONS.register_path("slerp", "raycompat.transformations.slerp:SlerpTransformation")

# The kinds fitted on paired rows without training (``fit.fit_kind``), by name.
FITTED_KINDS = ("procrustes", "affine", "adapter", "slerp")
# Those of them fitted on the rows themselves (held-out pairs choose their weights or alpha);
# the others are fitted from statistics merged over parts (``fit.fit_statistics``).
ROW_FITTED_KINDS = ("adapter", "slerp")

# The kind of a stored spec without a "kind" key: every export written before kinds were
# recorded is FCT's h or g.
UNRECORDED_KIND = "fct"


def list_transformations() -> list[str]:
    """The registered kinds, sorted."""
    return TRANSFORMATIONS.names()


def transformation_class(kind: str) -> type[Transformation]:
    """The class of ``kind``; an unknown kind raises ``UnknownNameError`` listing the kinds."""
    return TRANSFORMATIONS.get(kind)  # type: ignore[return-value]


def create_transformation(kind: str, /, **spec: Any) -> Transformation:
    """A new ``kind`` transformation built from its constructor ``spec`` (fresh weights)."""
    return TRANSFORMATIONS.create(kind, **spec)
