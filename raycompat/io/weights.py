"""Read model weights from a local path or an object store (``s3://bucket/key``) through fsspec
(:func:`raycompat.io.uri.fsspec_filesystem`, the I/O layer's fsspec form).

Opening a file and checking that one opens (:func:`open_uri`, :func:`check_uri`) live in the
torch-free :mod:`raycompat.io.uri`, so a config check can use them.

Nothing is ever downloaded from a model hub: weights are files the user names. ``.safetensors``
files are read with :func:`safetensors.torch.load`; anything else with
``torch.load(..., weights_only=True)``, which refuses pickles that would run code.
Credentials come from the environment (``AWS_ACCESS_KEY_ID`` ...) or ``storage_options``
(``key``/``secret``, ``client_kwargs={"endpoint_url": ...}``: the store's and the runs' options)
and are never logged.
"""

from __future__ import annotations

import io
import logging
import pickle
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from raycompat.errors import DataError
from raycompat.io.uri import open_uri

logger = logging.getLogger(__name__)

WEIGHTS_HINT = (
    "set model.weights to a local or s3:// path of a .safetensors or state-dict file; "
    "nothing is downloaded at run time"
)
_NESTING_KEYS = ("state_dict", "model", "module")
_SHOW = 5  # how many offending keys an error message lists


class WeightsMismatchError(DataError, ValueError):
    """A state dict does not fit a model: missing / unexpected keys or shape mismatches."""


def _unpickle_reason(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return next((line for line in lines if "nsupported" in line), lines[0] if lines else "")


def _unwrap(obj: Any, uri: str) -> dict[str, torch.Tensor]:
    while isinstance(obj, Mapping):
        inner = next((obj[k] for k in _NESTING_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, Mapping):
        raise ValueError(f"{uri}: expected a state dict (name -> tensor), got {type(obj).__name__}")
    state: dict[str, torch.Tensor] = {}
    for key, value in obj.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{uri}: entry {key!r} is a {type(value).__name__}, not a tensor; "
                "expected a state dict (optionally nested under 'state_dict' or 'model')"
            )
        name = str(key)
        while name.startswith("module."):  # DistributedDataParallel wrapping
            name = name[len("module.") :]
        state[name] = value
    return state


def load_state_dict(uri: str, storage_options: dict | None = None) -> dict[str, torch.Tensor]:
    """Read a state dict (on CPU) from ``uri``.

    Unwraps ``{"state_dict": ...}`` / ``{"model": ...}`` nesting and strips ``module.`` prefixes.
    Raises ``FileNotFoundError`` (with :data:`WEIGHTS_HINT`), ``PermissionError``, or
    ``pickle.UnpicklingError`` when the file holds objects other than tensors and containers.
    """
    uri = str(uri)
    try:
        with open_uri(uri, "rb", storage_options) as f:
            data = f.read()
    except FileNotFoundError as err:
        raise FileNotFoundError(f"weights file not found: {uri!r}; {WEIGHTS_HINT}") from err
    logger.debug("read %d bytes of weights from %s", len(data), uri)
    if uri.endswith(".safetensors"):
        from safetensors.torch import load

        try:
            obj: Any = load(data)
        except Exception as err:  # safetensors raises its own error type for corrupt headers
            raise ValueError(f"{uri}: not a valid .safetensors file ({err})") from err
    else:
        try:
            obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            raise pickle.UnpicklingError(
                f"{uri}: refused to load: {_unpickle_reason(err)}. Only tensors and plain "
                "containers are accepted (torch.load weights_only=True), so a checkpoint that "
                "pickles arbitrary objects is never executed; save model.state_dict() or a "
                ".safetensors file instead"
            ) from err
    return _unwrap(obj, uri)


def load_state_dict_into(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str, strict: bool = True
) -> nn.modules.module._IncompatibleKeys:
    """Copy ``state_dict`` into ``model``; raise :class:`WeightsMismatchError` naming ``source``
    on shape mismatches always, and on missing / unexpected keys when ``strict``."""
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    mismatched = [
        f"{k}: file {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
        for k in state_dict
        if k in own and state_dict[k].shape != own[k].shape
    ]
    problems = [
        f"{len(items)} {label} (first: {', '.join(items[:_SHOW])})"
        for label, items in (
            ("shape mismatches", mismatched),
            ("missing keys", missing if strict else []),
            ("unexpected keys", unexpected if strict else []),
        )
        if items
    ]
    if problems:
        raise WeightsMismatchError(
            f"weights {source!r} do not fit {type(model).__name__}: {'; '.join(problems)}"
        )
    if missing or unexpected:
        logger.warning(
            "non-strict load of %s: %d missing, %d unexpected keys",
            source,
            len(missing),
            len(unexpected),
        )
    return model.load_state_dict(state_dict, strict=False)


def load_weights(
    model: nn.Module, uri: str, strict: bool = True, storage_options: dict | None = None
) -> nn.modules.module._IncompatibleKeys:
    """:func:`load_state_dict` from ``uri`` then :func:`load_state_dict_into` ``model``."""
    return load_state_dict_into(
        model, load_state_dict(uri, storage_options), source=str(uri), strict=strict
    )
