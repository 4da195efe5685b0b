"""Compatibility methods, registered by name (see :mod:`raycompat.methods.base`)."""

from raycompat.methods import baselines, bct, dsimplex, fct, nifcl  # noqa: F401  (registration)
from raycompat.methods.base import (
    METHODS,
    Batch,
    CompatibilityMethod,
    OldModel,
    create_method,
    list_methods,
)

__all__ = ["METHODS", "Batch", "CompatibilityMethod", "OldModel", "create_method", "list_methods"]
