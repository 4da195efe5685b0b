"""The FCT transformations a pipeline applies, in the training run's export format.

``raycompat.fct.export`` writes ``h`` as ``<dir>/h.safetensors`` + ``<dir>/h.json`` and
``g`` as ``<dir>/g.*`` (the JSON holds ``d_old``, ``d_side``, ``d_new``, ``width``,
``normalize_output``). The pipelines take the directory of ``h`` and that of ``g`` (usually the
same one), read the JSON alone to check widths against the store *before* any Ray work, and
rebuild the modules in each actor. No Ray here.
"""

from __future__ import annotations

from pathlib import Path

from raycompat.fct.export import (  # noqa: F401  (re-exported for the pipelines)
    export_transformation,
    load_transformation,
    read_transformation_spec,
)
from raycompat.fct.transformation import FCTTransformation

H, G = "h", "g"


def save_transformation(directory: str | Path, module: FCTTransformation, name: str = H) -> None:
    """Write ``module`` as ``name`` (``"h"`` or ``"g"``) in the training run's format."""
    dims = {
        "d_old": module.d_old,
        "d_side": module.d_side,
        "d_new": module.d_new,
        "width": module.old_projection[0].out_features,
        "normalize_output": module.normalize_output,
        "uncertainty": module.uncertainty_head is not None,
    }
    export_transformation(directory, name, module.state_dict(), dims)


def weights_path(directory: str | Path, name: str = H) -> Path:
    return Path(directory) / f"{name}.safetensors"
