"""Transformations: functions from old embeddings to a new model's space, one registry of kinds.

A transformation ``h(old[, side]) -> new`` upgrades a gallery without re-extracting its images
(the transform pipeline, the partial backfill) or maps queries between spaces. Every kind
implements one interface and saves and loads through the same files, so the pipelines, the
store's lineage and the backfill treat every kind alike:

- :mod:`~raycompat.transformations.base`: :class:`Transformation`, the interface (``forward``,
  widths, ``spec()``, an optional uncertainty);
- :mod:`~raycompat.transformations.kinds`: :data:`TRANSFORMATIONS`, the registry of kinds (no
  torch at import), :func:`create_transformation`, :func:`list_transformations`;
- :mod:`~raycompat.transformations.fct`: the ``"fct"`` kind, FCT's ``h`` and ``g`` MLP;
- :mod:`~raycompat.transformations.files`: ``<name>.safetensors`` + ``<name>.json`` (kind and
  spec): :func:`save_transformation`, :func:`load_transformation`, :func:`read_transformation`.

How a kind is fitted is its method's business: FCT's training run is :mod:`raycompat.fct`.
Importing the package loads no torch; the torch names load at their first use. No Ray here.
"""

from __future__ import annotations

import importlib
from typing import Any

from raycompat.transformations.kinds import (
    TRANSFORMATIONS,
    UNRECORDED_KIND,
    create_transformation,
    list_transformations,
    transformation_class,
)

_TORCH_NAMES = {
    "Transformation": "base",
    "INTERFACE_KEYS": "base",
    "FCTTransformation": "fct",
    "fct_transformation": "fct",
    "side_info_transformation": "fct",
    "G": "files",
    "H": "files",
    "StoredSpec": "files",
    "TransformationFiles": "files",
    "UnknownKindError": "files",
    "export_transformation": "files",
    "load_transformation": "files",
    "read_transformation": "files",
    "read_transformation_spec": "files",
    "save_transformation": "files",
    "weights_path": "files",
}

__all__ = [
    "TRANSFORMATIONS",
    "UNRECORDED_KIND",
    "create_transformation",
    "list_transformations",
    "transformation_class",
    *_TORCH_NAMES,
]


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        module = importlib.import_module(f"raycompat.transformations.{_TORCH_NAMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'raycompat.transformations' has no attribute {name!r}")
