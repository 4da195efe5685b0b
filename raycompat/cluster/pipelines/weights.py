"""Weights reach the pipelines' actors through Ray's object store, never through a folder.

An actor may run on any node, and the folder a transformation ``h`` or an exported model was
written to may exist only on the driver's node (a job's ``work_dir`` on the head). So the driver
reads each weights file once (a local folder, or an ``s3://`` URI for ``h``/``g``), puts the
bytes in Ray's object store (:func:`share_transformation`, :func:`share_model`) and hands the
actors the reference; each actor builds its module from it (:func:`transformation_of`,
:func:`model_of`) wherever it runs. The object is put once per pipeline, not once per actor.

A plain path is still accepted by the ``*_of`` functions, for actors built in process (tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ray
from safetensors.torch import load
from torch import nn

from raycompat.config.train import ModelSpec
from raycompat.io.uri import open_uri
from raycompat.io.weights import load_state_dict_into
from raycompat.train.export import MODEL_FILE, build_model, load_exported_model, read_spec
from raycompat.transformations import Transformation, TransformationFiles, read_transformation


@dataclass(frozen=True)
class ModelFiles:
    """An exported model read into memory: its spec and its ``model.safetensors`` bytes."""

    location: str
    spec: ModelSpec
    weights: bytes

    def build(self) -> nn.Module:
        model = build_model(self.spec)
        source = f"{self.location}/{MODEL_FILE}"
        load_state_dict_into(model, load(self.weights), source=source)
        return model.eval()


@dataclass(frozen=True)
class Shared:
    """A reference to weights in Ray's object store, and where they were read (messages)."""

    location: str
    ref: ray.ObjectRef

    def get(self):
        return ray.get(self.ref)


def share_transformation(files: TransformationFiles) -> Shared:
    """Put ``h`` or ``g`` (read by the driver with ``read_transformation``) in the object store."""
    return Shared(files.location, ray.put(files))


def share_model(directory: str | Path) -> Shared:
    """Read the exported model in ``directory`` on the driver and put it in the object store."""
    spec, _ = read_spec(directory)
    with open_uri(str(Path(directory) / MODEL_FILE)) as handle:
        weights = handle.read()
    return Shared(str(directory), ray.put(ModelFiles(str(directory), spec, weights)))


def transformation_of(weights: Shared | str, name: str) -> Transformation:
    """``h``/``g`` of any kind (eval mode, CPU) from a shared reference, or from a folder (in
    process)."""
    files = weights.get() if isinstance(weights, Shared) else read_transformation(weights, name)
    return files.build()


def model_of(weights: Shared | str) -> nn.Module:
    """The exported model (eval mode, CPU) from a shared reference, or from a folder."""
    if isinstance(weights, Shared):
        return weights.get().build()
    return load_exported_model(weights)[0]
