"""A trained model as files: ``model.safetensors`` + ``model.json`` (architecture and labels).

This is what every step's checkpoint carries besides the strategy's own (possibly sharded)
training state, and what later steps, the upgrade job and the search CLI load: plain tensors
(safetensors, no pickle) and a JSON description, independent of how the model was trained.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from raycompat.config import _build
from raycompat.config.train import ModelSpec
from raycompat.io.weights import load_state_dict, load_state_dict_into
from raycompat.nn.models import CompatModel, create_model

MODEL_FILE, SPEC_FILE = "model.safetensors", "model.json"


def build_model(spec: ModelSpec) -> CompatModel:
    return create_model(
        spec.backbone,
        spec.head,
        num_classes=spec.num_classes,
        embed_dim=spec.embed_dim,
        backbone_kwargs=spec.backbone_kwargs,
        head_kwargs=spec.head_kwargs,
    )


def export_model(directory: str | Path, state_dict: dict, spec: ModelSpec, **info) -> None:
    """Write the full (unsharded) state and its description into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    save_file(tensors, str(directory / MODEL_FILE))
    (directory / SPEC_FILE).write_text(json.dumps({"model": dataclasses.asdict(spec), **info}))


def read_spec(directory: str | Path) -> tuple[ModelSpec, dict]:
    info = json.loads((Path(directory) / SPEC_FILE).read_text())
    return _build(ModelSpec, info.pop("model"), "model."), info


def load_exported_model(directory: str | Path) -> tuple[CompatModel, dict]:
    """``(model in eval mode, info)`` from a directory written by :func:`export_model`."""
    spec, info = read_spec(directory)
    model = build_model(spec)
    source = str(Path(directory) / MODEL_FILE)
    load_state_dict_into(model, load_state_dict(source), source=source)
    return model.eval(), info


def save_features(directory: str | Path, name: str, features: torch.Tensor) -> None:
    np.save(Path(directory) / f"{name}_features.npy", features.float().cpu().numpy())


def load_features(directory: str | Path, name: str) -> np.ndarray:
    return np.load(Path(directory) / f"{name}_features.npy", allow_pickle=False)
