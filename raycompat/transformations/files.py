"""A transformation as files, and read back into memory for the pipelines.

``h`` is ``<dir>/h.safetensors`` (plain tensors, no pickle) plus ``<dir>/h.json``: its ``kind``
(:data:`~raycompat.transformations.kinds.TRANSFORMATIONS`) and its constructor spec (for every
kind ``d_old``, ``d_side``, ``d_new``, ``normalize_output``; then the kind's own keys), and
whatever the run that wrote it adds (``epoch``). FCT's side-information transformation ``g`` is
``<dir>/g.*`` beside it. A spec without ``kind`` was written before kinds were recorded and
reads as ``"fct"``; a kind this raycompat does not know is one error naming the file.

The pipelines take the location of ``h`` and that of ``g`` (a local folder or an ``s3://``
URI), read both files once on the driver (:func:`read_transformation`), check widths against
the store from the spec *before* any Ray work, and ship the bytes to the actors (through Ray's
object store, in the Ray layer), which rebuild the modules with
:meth:`TransformationFiles.build` without reading any file. No Ray here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load, save_file

from raycompat.errors import DataError
from raycompat.io.uri import open_uri
from raycompat.io.weights import load_state_dict_into
from raycompat.transformations.base import Transformation
from raycompat.transformations.kinds import (
    TRANSFORMATIONS,
    UNRECORDED_KIND,
    create_transformation,
    list_transformations,
    transformation_class,
)

H, G = "h", "g"


class UnknownKindError(DataError, ValueError):
    """A stored transformation spec names a kind this raycompat does not know."""


@dataclass(frozen=True)
class StoredSpec:
    """What ``<name>.json`` says: the ``kind`` and its constructor arguments ``args``."""

    kind: str
    args: dict[str, Any]

    @property
    def d_old(self) -> int:
        return self.args["d_old"]

    @property
    def d_side(self) -> int:
        return self.args["d_side"]

    @property
    def d_new(self) -> int:
        return self.args["d_new"]

    @property
    def normalize_output(self) -> bool:
        return self.args["normalize_output"]

    @property
    def uncertainty(self) -> bool:
        """Whether it has a per-row uncertainty (only kinds with such a head take the key)."""
        return bool(self.args.get("uncertainty", False))

    def build(self) -> Transformation:
        """The module with fresh weights."""
        return create_transformation(self.kind, **self.args)


def stored_spec(info: Any, where: str) -> StoredSpec:
    """The spec in ``info`` (a parsed ``<name>.json``); ``where`` names the file in errors."""
    if not isinstance(info, dict):
        raise ValueError(f"{where}: holds a {type(info).__name__}, not a transformation spec")
    kind = info.get("kind", UNRECORDED_KIND)
    if kind not in TRANSFORMATIONS:
        raise UnknownKindError(
            f"{where}: unknown transformation kind {kind!r}; this raycompat reads "
            f"{', '.join(list_transformations())}"
        )
    cls = transformation_class(kind)
    missing = cls.missing_keys(info)
    if missing:
        raise ValueError(f"{where}: lacks {missing}")
    return StoredSpec(kind, cls.args_of(info))


def export_transformation(
    directory: str | Path, name: str, state_dict: dict, dims: dict, *, kind: str, **info
) -> None:
    """Write ``name`` (``"h"`` or ``"g"``) from its state and ``dims`` (the ``kind``'s
    constructor arguments; other keys are ignored) into the local ``directory``; ``info``
    (``epoch=...``) is recorded beside the spec."""
    cls = transformation_class(kind)
    missing = cls.missing_keys(dims)
    if missing:
        raise ValueError(f"export_transformation({name!r}): dims lack {', '.join(missing)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    save_file(tensors, str(weights_path(directory, name)))
    spec = {"kind": kind, **cls.args_of(dims), **info}
    (directory / f"{name}.json").write_text(json.dumps(spec, indent=2))


def save_transformation(
    directory: str | Path, module: Transformation, name: str = H, **info
) -> None:
    """Write ``module`` as ``name`` (``"h"`` or ``"g"``), its kind and spec recorded."""
    export_transformation(
        directory, name, module.state_dict(), module.spec(), kind=module.kind, **info
    )


def weights_path(directory: str | Path, name: str = H) -> Path:
    return Path(directory) / f"{name}.safetensors"


@dataclass(frozen=True)
class TransformationFiles:
    """``h`` or ``g`` read into memory: its stored spec and the bytes of its ``.safetensors``
    file. An actor on any node rebuilds the module from this alone."""

    name: str  # "h" or "g"
    location: str  # the folder or URI it was read from (for messages)
    spec: StoredSpec
    weights: bytes

    @property
    def digest(self) -> str:
        """SHA-256 of the weights file (what a staging area's plan records)."""
        return hashlib.sha256(self.weights).hexdigest()

    def build(self) -> Transformation:
        """The module in eval mode, on the CPU."""
        source = f"{self.location.rstrip('/')}/{self.name}.safetensors"
        try:
            state = load(self.weights)
        except Exception as err:  # safetensors raises its own error type for corrupt headers
            raise ValueError(f"{source}: not a valid .safetensors file ({err})") from err
        model = self.spec.build()
        load_state_dict_into(model, state, source=source)
        return model.eval()


def read_transformation_spec(
    location: str | Path, name: str = H, storage_options: dict | None = None
) -> StoredSpec:
    """``<location>/<name>.json`` without the weights (cheap up-front checks)."""
    spec_uri = f"{str(location).rstrip('/')}/{name}.json"
    try:
        with open_uri(spec_uri, "rb", storage_options) as handle:
            info = json.loads(handle.read())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{spec_uri} does not exist: not an exported transformation '{name}' directory"
        ) from None
    return stored_spec(info, spec_uri)


def read_transformation(
    location: str | Path, name: str = H, storage_options: dict | None = None
) -> TransformationFiles:
    """Read ``<location>/<name>.json`` and ``<location>/<name>.safetensors`` (a local folder or
    an ``s3://...`` URI; ``storage_options`` as the store's) into memory."""
    spec = read_transformation_spec(location, name, storage_options)
    base = str(location).rstrip("/")
    with open_uri(f"{base}/{name}.safetensors", "rb", storage_options) as handle:
        weights = handle.read()
    return TransformationFiles(name, str(location), spec, weights)


def load_transformation(
    location: str | Path, name: str = H, storage_options: dict | None = None
) -> Transformation:
    """``h`` (or ``g`` with ``name="g"``) in eval mode on the CPU, with whatever head (FastFill's
    uncertainty) it was trained with."""
    return read_transformation(location, name, storage_options).build()
