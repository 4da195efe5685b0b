"""The FCT transformations a pipeline applies, in the training run's export format.

``raycompat.fct.export`` writes ``h`` as ``<dir>/h.safetensors`` + ``<dir>/h.json`` and
``g`` as ``<dir>/g.*`` (the JSON holds ``d_old``, ``d_side``, ``d_new``, ``width``,
``normalize_output``). The pipelines take the location of ``h`` and that of ``g`` (usually the
same one: a local folder or an ``s3://`` URI), read both files once on the driver
(:func:`read_transformation`), check widths against the store from the JSON *before* any Ray
work, and ship the bytes to the actors (through Ray's object store, in the Ray layer), which
rebuild the modules with :meth:`TransformationFiles.build` without reading any file. No Ray here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from raycompat.fct.export import (
    OPTIONAL_TRANSFORMATION_KEYS,
    TRANSFORMATION_KEYS,
    export_transformation,
)
from raycompat.fct.transformation import FCTTransformation
from raycompat.io.uri import open_uri
from raycompat.io.weights import load_state_dict_into

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


@dataclass(frozen=True)
class TransformationFiles:
    """``h`` or ``g`` read into memory: its builder arguments (``spec``) and the bytes of its
    ``.safetensors`` file. An actor on any node rebuilds the module from this alone."""

    name: str  # "h" or "g"
    location: str  # the folder or URI it was read from (for messages)
    spec: dict  # FCTTransformation's arguments, as read_transformation_spec gives them
    weights: bytes

    @property
    def digest(self) -> str:
        """SHA-256 of the weights file (what a staging area's plan records)."""
        return hashlib.sha256(self.weights).hexdigest()

    def build(self) -> FCTTransformation:
        """The module in eval mode, on the CPU."""
        from safetensors.torch import load

        source = f"{self.location.rstrip('/')}/{self.name}.safetensors"
        try:
            state = load(self.weights)
        except Exception as err:  # safetensors raises its own error type for corrupt headers
            raise ValueError(f"{source}: not a valid .safetensors file ({err})") from err
        model = FCTTransformation(**self.spec)
        load_state_dict_into(model, state, source=source)
        return model.eval()


def read_transformation(
    location: str | Path, name: str = H, storage_options: dict | None = None
) -> TransformationFiles:
    """Read ``<location>/<name>.json`` and ``<location>/<name>.safetensors`` (a local folder or
    an ``s3://...`` URI; ``storage_options`` as the store's) into memory."""
    base = str(location).rstrip("/")
    spec_uri = f"{base}/{name}.json"
    try:
        with open_uri(spec_uri, "rb", storage_options) as handle:
            info = json.loads(handle.read())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{spec_uri} does not exist: not an exported FCT '{name}' directory"
        ) from None
    missing = [k for k in TRANSFORMATION_KEYS if not isinstance(info, dict) or k not in info]
    if missing:
        raise ValueError(f"{spec_uri}: lacks {missing}")
    spec = {k: info[k] for k in TRANSFORMATION_KEYS}
    spec.update({k: info.get(k, v) for k, v in OPTIONAL_TRANSFORMATION_KEYS.items()})
    with open_uri(f"{base}/{name}.safetensors", "rb", storage_options) as handle:
        weights = handle.read()
    return TransformationFiles(name, str(location), spec, weights)
