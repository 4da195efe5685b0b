"""Compatibility methods, registered by name in one table (:mod:`raycompat.methods.catalog`).

Importing the package loads no torch: the registry, :func:`list_methods` and the config checks
come from the catalogue, and the torch pieces (:class:`Batch`, :class:`OldModel`,
:class:`CompatibilityMethod`, :class:`CrossEntropyMethod`, :func:`create_method`) load at their
first use. A method class loads when :data:`METHODS` first gets its name.
"""

from __future__ import annotations

from raycompat._lazy import lazy_exports
from raycompat.methods.catalog import (
    METHOD_CATALOG,
    METHODS,
    MethodEntry,
    check_method_options,
    list_methods,
    method_entry,
)

__getattr__, __dir__, _TORCH_NAMES = lazy_exports(
    __name__,
    {"base": ("Batch", "CompatibilityMethod", "CrossEntropyMethod", "OldModel", "create_method")},
)

__all__ = [
    "METHODS",
    "METHOD_CATALOG",
    "MethodEntry",
    "check_method_options",
    "list_methods",
    "method_entry",
    *_TORCH_NAMES,
]
