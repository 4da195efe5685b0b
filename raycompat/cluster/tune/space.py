"""Search space: :class:`ParamSpec` s -> Tune ``param_space``; trial params -> overrides."""

from __future__ import annotations

import json

from ray import tune

from raycompat.config.tune import ParamSpec
from raycompat.registry import Registry

PARAM_KINDS: Registry = Registry("search-space kind")


def _values(spec: ParamSpec):
    if not spec.values:
        raise ValueError(f"space: {spec.key} ({spec.kind}) needs a non-empty 'values' list")
    return spec.values


def _bounds(spec: ParamSpec):
    if spec.low is None or spec.high is None or not spec.low < spec.high:
        raise ValueError(f"space: {spec.key} ({spec.kind}) needs low < high")
    return spec.low, spec.high


PARAM_KINDS.register("grid")(lambda s: tune.grid_search(_values(s)))
PARAM_KINDS.register("choice")(lambda s: tune.choice(_values(s)))
PARAM_KINDS.register("uniform")(lambda s: tune.uniform(*_bounds(s)))
PARAM_KINDS.register("loguniform")(lambda s: tune.loguniform(*_bounds(s)))
PARAM_KINDS.register("randint")(lambda s: tune.randint(*(int(v) for v in _bounds(s))))


def param_space(space: list[ParamSpec]) -> dict:
    keys = [s.key for s in space]
    if len(set(keys)) != len(keys):
        raise ValueError(f"space: a key appears twice in {keys}")
    return {s.key: PARAM_KINDS.get(s.kind)(s) for s in space}


def trial_overrides(params: dict) -> list[str]:
    """``{"optim.lr": 0.01}`` -> ``["optim.lr=0.01"]`` (JSON values parse as YAML scalars)."""
    return [f"{key}={json.dumps(value)}" for key, value in sorted(params.items())]
