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
- :mod:`~raycompat.transformations.linear`: the ``"procrustes"`` and ``"affine"`` kinds,
  ``x W + b``; :mod:`~raycompat.transformations.adapter`: the ``"adapter"`` kind, ``x A + b``
  plus a residual MLP;
- :mod:`~raycompat.transformations.files`: ``<name>.safetensors`` + ``<name>.json`` (kind and
  spec): :func:`save_transformation`, :func:`load_transformation`, :func:`read_transformation`;
- :mod:`~raycompat.transformations.statistics` (:class:`PairStatistics`, the sufficient
  statistics of paired rows, merged over parts), :mod:`~raycompat.transformations.pairs` (their
  checks) and :mod:`~raycompat.transformations.fit` (:func:`fit_procrustes`,
  :func:`fit_affine`, :func:`fit_adapter`): the training-free fits (docs/transformations.md).

How a kind is fitted is its method's business: FCT's training run is :mod:`raycompat.fct`.
Importing the package loads no torch; the torch names load at their first use. No Ray here.
"""

from __future__ import annotations

from raycompat._lazy import lazy_exports
from raycompat.transformations.kinds import (
    TRANSFORMATIONS,
    UNRECORDED_KIND,
    create_transformation,
    list_transformations,
    transformation_class,
)

__getattr__, __dir__, _TORCH_NAMES = lazy_exports(
    __name__,
    {
        "adapter": ("AdapterTransformation",),
        "base": ("INTERFACE_KEYS", "Transformation"),
        "fit": (
            "Fit",
            "fit_adapter",
            "fit_affine",
            "fit_kind",
            "fit_procrustes",
            "fit_statistics",
        ),
        "linear": ("AffineTransformation", "ProcrustesTransformation"),
        "slerp": ("SlerpTransformation", "spherical_interpolation"),
        "slerp_fit": ("fit_slerp",),
        "pairs": ("PairsError", "check_pairs"),
        "statistics": ("PairStatistics",),
        "fct": ("FCTTransformation", "side_info_transformation"),
        "files": (
            "G",
            "H",
            "StoredSpec",
            "TransformationFiles",
            "UnknownKindError",
            "export_transformation",
            "load_transformation",
            "read_transformation",
            "read_transformation_spec",
            "save_transformation",
            "weights_path",
        ),
    },
)

__all__ = [
    "TRANSFORMATIONS",
    "UNRECORDED_KIND",
    "create_transformation",
    "list_transformations",
    "transformation_class",
    *_TORCH_NAMES,
]
