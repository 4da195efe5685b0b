"""Compatibility methods, registered by name in one table (:mod:`raycompat.methods.catalog`).

Importing the package loads no torch: the registry, :func:`list_methods` and the config checks
come from the catalogue, and the torch pieces (:class:`Batch`, :class:`OldModel`,
:class:`CompatibilityMethod`, :func:`create_method`) load at their first use. A method class
loads when :data:`METHODS` first gets its name.
"""

from __future__ import annotations

from typing import Any

from raycompat.methods.catalog import (
    METHOD_CATALOG,
    METHODS,
    MethodEntry,
    check_method_options,
    list_methods,
    method_entry,
)

_TORCH_NAMES = ("Batch", "CompatibilityMethod", "OldModel", "create_method")

__all__ = [
    "METHODS",
    "METHOD_CATALOG",
    "MethodEntry",
    "check_method_options",
    "list_methods",
    "method_entry",
    *_TORCH_NAMES,
]


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        from raycompat.methods import base

        return getattr(base, name)
    raise AttributeError(f"module 'raycompat.methods' has no attribute {name!r}")
