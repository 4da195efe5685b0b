"""Typed configuration: dataclasses loaded from YAML with ``key.sub=value`` overrides.

Defaults (the dataclass) -> file -> command-line overrides, in that order. Unknown keys and
values of the wrong type are errors naming the key, so a typo never silently falls back to a
default.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

C = TypeVar("C")


class ConfigError(ValueError):
    """A config key is unknown, missing or of the wrong type; the message names the key."""


class ConfigLoader(yaml.SafeLoader):
    """YAML 1.1 reads ``3e-5`` (no dot in the mantissa) as a string; every config, override
    and sampled sweep value (``json.dumps(3e-05)``) means the float, as YAML 1.2 does."""


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return _build(annotation, value, key + ".")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation in (int, float, str, bool):
        if type(value) is not annotation:
            raise ConfigError(f"{key}: expected {annotation.__name__}, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported annotation {annotation!r}")


def _build(cls: type[C], data: dict, prefix: str = "") -> C:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + u for u in unknown)}; "
            f"valid keys here: {', '.join(prefix + f for f in fields)}"
        )
    kwargs = {name: _coerce(value, hints[name], prefix + name) for name, value in data.items()}
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(
            f"missing required config key(s): {', '.join(prefix + m for m in missing)}"
        )
    return cls(**kwargs)


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict:
    """``["train.epochs=3", "method.name=bct"]`` -> nested dict (values parsed as YAML scalars)."""
    data: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        key, raw = item.split("=", 1)
        _set_dotted(data, key.strip(), load_yaml(raw) if raw else "")
    return data


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _defaults(cls: type) -> dict:
    """The default instance as a dict, or {} when ``cls`` has required fields."""
    try:
        return to_dict(cls())
    except TypeError:
        return {}


def load_config(
    cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None
) -> C:
    """Build ``cls`` from defaults, an optional YAML file and ``key=value`` overrides.

    A section given in part keeps the defaults of the rest of that section, including defaults
    that a parent class sets for it (``UpgradeConfig.training`` is not ``TrainConfig()``).
    """
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        loaded = load_yaml(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded
    data = _merge(_merge(_defaults(cls), data), parse_overrides(overrides or []))
    try:
        return _build(cls, data)
    except ConfigError as exc:
        where = f"{path}: " if path is not None else ""
        raise ConfigError(f"{where}{exc}") from None


def apply_overrides(config: C, overrides: list[str]) -> C:
    """A copy of ``config`` with ``key.sub=value`` overrides applied and re-validated."""
    try:
        return _build(type(config), _merge(to_dict(config), parse_overrides(overrides)))
    except ConfigError as exc:
        raise ConfigError(f"overrides {overrides}: {exc}") from None


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def save_config(config: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
