"""FCT's side-information model ``psi`` as files (FCT sec. 3.4).

Like :mod:`raycompat.train.export` and the transformations ``h``/``g``
(:mod:`raycompat.transformations.files`), ``psi`` is ``side_info.safetensors`` (plain tensors,
no pickle) plus ``side_info.json`` (what to build), so the upgrade job loads it without Ray and
without knowing how it was trained. Nothing here imports Ray.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from safetensors.torch import save_file
from torch import nn

from raycompat.config import _build
from raycompat.config.fct import SideInfoSpec
from raycompat.io.weights import load_state_dict, load_state_dict_into
from raycompat.nn.side_info import create_side_info

SIDE_INFO = "side_info"


def _save(directory: str | Path, name: str, state_dict: dict, info: dict) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    save_file(tensors, str(directory / f"{name}.safetensors"))
    (directory / f"{name}.json").write_text(json.dumps(info, indent=2))


def _read_info(directory: str | Path, name: str) -> dict:
    path = Path(directory) / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: not an exported FCT '{name}' directory")
    return json.loads(path.read_text())


def _load_into(model: nn.Module, directory: str | Path, name: str) -> nn.Module:
    source = str(Path(directory) / f"{name}.safetensors")
    load_state_dict_into(model, load_state_dict(source), source=source)
    return model.eval()


def export_side_info(directory, state_dict: dict, spec: SideInfoSpec, **info) -> None:
    """Write the SimCLR side-information model (with its projection head) and its spec."""
    _save(directory, SIDE_INFO, state_dict, {"name": "simclr", **dataclasses.asdict(spec), **info})


def load_side_info(directory: str | Path) -> nn.Module:
    """The side-information model (eval mode); ``forward_features(x) -> (B, embed_dim)``."""
    info = _read_info(directory, SIDE_INFO)
    spec = _build(
        SideInfoSpec,
        {k: info[k] for k in ("backbone", "embed_dim", "projection_dim", "backbone_kwargs")},
        "side_info.",
    )
    model = create_side_info(info["name"], **dataclasses.asdict(spec))
    return _load_into(model, directory, SIDE_INFO)
