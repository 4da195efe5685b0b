"""Typed configuration: dataclasses loaded from YAML with ``key.sub=value`` overrides.

Defaults (the dataclass) -> file -> command-line overrides, in that order. Unknown keys and
values of the wrong type are errors naming the key, so a typo never silently falls back to a
default. A field declared with :func:`bounded` is range-checked too (``epochs: int = bounded(4,
ge=1)``), so that a value that type-checks but cannot be meant (0 epochs) fails at load time.

Every job's typed config is exported here too (``from raycompat.config import TrainConfig``); it
is defined in its own module (:mod:`.train`, :mod:`.fct`, :mod:`.tune`, :mod:`.upgrade`,
:mod:`.pipelines`), each importing this one, and loads at its first use.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from raycompat._lazy import lazy_exports
from raycompat.errors import ConfigError
from raycompat.registry import did_you_mean

C = TypeVar("C")


class ConfigLoader(yaml.SafeLoader):
    """YAML 1.1 reads ``3e-5`` (no dot in the mantissa) as a string; every config, override
    and sampled sweep value (``json.dumps(3e-05)``) means the float, as YAML 1.2 does."""


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str, source: str | Path | None = None) -> Any:
    """``text`` parsed as YAML; a syntax error is a :class:`ConfigError` of one line naming
    ``source`` (the file, or the override), the line and the column: ``bad.yaml: line 3,
    column 9: YAML syntax error: expected ',' or ']', but found '<stream end>'``."""
    try:
        return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as error:
        raise ConfigError(yaml_error_line(error, source)) from None


def yaml_error_line(error: yaml.YAMLError, source: str | Path | None = None) -> str:
    """One line for a YAML syntax error: where (``source``, then the line and column, 1-based,
    of the problem PyYAML marks), what it found, and what it was reading (``while parsing a
    flow sequence started at line 3, column 9``)."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None)
    where = [str(source)] if source is not None else []
    if mark is not None:
        where.append(f"line {mark.line + 1}, column {mark.column + 1}")
    line = ": ".join([*where, f"YAML syntax error: {problem or ' '.join(str(error).split())}"])
    context, started = getattr(error, "context", None), getattr(error, "context_mark", None)
    if problem and context:
        at = f" started at line {started.line + 1}, column {started.column + 1}" if started else ""
        line += f" ({context}{at})"
    return line


_BOUNDS = {
    "ge": (">=", operator.ge),
    "gt": (">", operator.gt),
    "le": ("<=", operator.le),
    "lt": ("<", operator.lt),
}


def bounded(default: Any = dataclasses.MISSING, **bounds: float) -> Any:
    """A dataclass field with a scalar ``default`` whose value must satisfy ``bounds``.

    ``bounds``: any of ``ge``, ``gt``, ``le``, ``lt`` (pydantic's names: >=, >, <=, <). ``None``
    values are not checked (an optional field left unset). Without ``default`` the field is
    required (``d_old: int = bounded(ge=1)``). Checked by :func:`load_config`,
    :func:`apply_overrides` and :func:`check_ranges`.
    """
    unknown = sorted(set(bounds) - set(_BOUNDS))
    if unknown:
        raise TypeError(f"bounded: unknown bound(s) {unknown}; valid: {sorted(_BOUNDS)}")
    return dataclasses.field(default=default, metadata={"bounds": bounds})


def check_range(obj: Any, name: str, *, where: str = "", **bounds: float) -> None:
    """Raise :class:`ConfigError` unless ``obj.<name>`` satisfies ``bounds`` (see :func:`bounded`).

    The message names the key, ``where + name``: ``training.epochs must be >= 1, got 0``.
    """
    value = getattr(obj, name)
    if value is None:
        return
    for bound, limit in bounds.items():
        symbol, holds = _BOUNDS[bound]
        if not holds(value, limit):
            raise ConfigError(f"{where}{name} must be {symbol} {limit}, got {value!r}")


def _check_fields(obj: Any, where: str) -> None:
    for f in dataclasses.fields(obj):
        if "bounds" in f.metadata:
            check_range(obj, f.name, where=where, **f.metadata["bounds"])


def check_ranges(config: Any, where: str = "") -> None:
    """Range-check every :func:`bounded` field of a config built in Python (not loaded), through
    nested sections and lists of sections; keys are named as :func:`load_config` names them."""
    if isinstance(config, list | tuple):
        for i, item in enumerate(config):
            check_ranges(item, f"{where.removesuffix('.')}[{i}].")
        return
    if not dataclasses.is_dataclass(config):
        return
    _check_fields(config, where)
    for f in dataclasses.fields(config):
        check_ranges(getattr(config, f.name), f"{where}{f.name}.")


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
            close = did_you_mean(value, map(str, args)) if isinstance(value, str) else ""
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, args))}{close}")
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
            + (did_you_mean(unknown, fields, prefix) or getattr(cls, "UNKNOWN_KEY_HINT", ""))
        )
    kwargs = {}
    for name, value in data.items():
        try:
            kwargs[name] = _coerce(value, hints[name], prefix + name)
        except ConfigError as err:
            hint = fields[name].metadata.get("hints", {}).get(value if type(value) is str else None)
            raise ConfigError(f"{err}; {hint}" if hint else str(err)) from None
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
    out = cls(**kwargs)
    _check_fields(out, prefix)  # nested sections were checked when they were built
    return out


_INDEX = re.compile(r"\[(\d+)\]")


def override_path(key: str) -> list[str]:
    """``"upgrades[0].epochs"`` or ``"upgrades.0.epochs"`` -> ``["upgrades", "0", "epochs"]``."""
    parts = _INDEX.sub(r".\1", key.strip()).split(".")
    if not all(parts):
        raise ConfigError(f"override key {key!r} has an empty part")
    return parts


def _step(node: Any, part: str, key: str) -> Any:
    """The child ``part`` of ``node`` (a section, or a list by index) on the way to ``key``."""
    if isinstance(node, list):
        return node[_list_index(node, part, key)]
    if not isinstance(node, dict):
        raise ConfigError(f"override {key!r}: {part!r} is not a section")
    if node.get(part) is None:  # an absent or null section: the override starts it
        node[part] = {}
    return node[part]


def _list_index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(
            f"override {key!r}: {part!r} is not an index of that list (it has {len(node)} "
            f"entries: 0..{len(node) - 1})"
        )
    return int(part)


def set_override(data: dict, key: str, value: Any, merge: bool = False) -> None:
    """Set ``key`` (dotted, list entries by index) to ``value`` in the nested ``data``; with
    ``merge``, a mapping value is merged into the mapping already there."""
    *parents, last = override_path(key)
    node = data
    for part in parents:
        node = _step(node, part, key)
    if isinstance(node, list):
        node[_list_index(node, last, key)] = value
    elif isinstance(node, dict):
        given = node.get(last)
        mergeable = merge and isinstance(given, dict) and isinstance(value, dict)
        node[last] = _merge(given, value) if mergeable else value
    else:
        raise ConfigError(f"override {key!r}: {parents[-1]!r} is not a section")


def _split_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.sub=value")
    key, raw = item.split("=", 1)
    return key, load_yaml(raw, f"override {item!r}") if raw else ""


def parse_overrides(overrides: list[str]) -> dict:
    """``["train.epochs=3", "method.name=bct"]`` -> nested dict (values parsed as YAML scalars);
    a later override of the same key replaces the earlier one. List entries cannot be addressed
    here (there is no list to index): see :func:`apply_to`."""
    data: dict = {}
    for item in overrides:
        key, value = _split_override(item)
        set_override(data, key, value)
    return data


def apply_to(data: dict, overrides: list[str]) -> dict:
    """A copy of the nested ``data`` with the overrides applied: those that name no list entry
    merged in as one nested dict (:func:`parse_overrides`, as always), then those that go
    through list entries by index (``upgrades.0.epochs=1``), in order, merged into what is
    there."""
    indexed = [o for o in overrides if _names_list_entry(data, o)]
    out = _merge(copy.deepcopy(data), parse_overrides([o for o in overrides if o not in indexed]))
    for item in indexed:
        key, value = _split_override(item)
        set_override(out, key, value, merge=True)
    return out


def _names_list_entry(data: dict, item: str) -> bool:
    """Whether the override's key goes through a list of ``data`` (or has an ``[i]`` index)."""
    key = item.split("=", 1)[0]
    if _INDEX.search(key):
        return True
    node = data
    for part in key.strip().split(".")[:-1]:
        if isinstance(node, list):
            return True
        node = node.get(part) if isinstance(node, dict) else None
    return isinstance(node, list)


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


def missing_config_file(path: str | Path) -> str:
    """``config file configs/upgrad.yaml does not exist; did you mean
    'configs/upgrade_mnist.yaml'?`` (the closest YAML file in that folder, if one is close)."""
    folder = Path(path).parent
    names = sorted(p.name for p in folder.glob("*.y*ml")) if folder.is_dir() else []
    prefix = "" if str(folder) == "." else f"{folder}/"
    return f"config file {path} does not exist" + did_you_mean(Path(path).name, names, prefix)


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
            raise FileNotFoundError(missing_config_file(path))
        loaded = load_yaml(path.read_text(), path) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded
    try:
        data = apply_to(_merge(_defaults(cls), data), overrides or [])
        return _build(cls, data)
    except ConfigError as exc:
        where = f"{path}: " if path is not None else ""
        raise ConfigError(f"{where}{exc}") from None


def apply_overrides(config: C, overrides: list[str]) -> C:
    """A copy of ``config`` with ``key.sub=value`` overrides applied and re-validated."""
    try:
        return _build(type(config), apply_to(to_dict(config), overrides))
    except ConfigError as exc:
        raise ConfigError(f"overrides {overrides}: {exc}") from None


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def dump_config(config: Any) -> str:
    """``config`` (a dataclass or dict) as YAML with its credentials redacted
    (:func:`raycompat.io.credentials.redact`): what every job writes next to its outputs."""
    from raycompat.io.credentials import redact

    data = to_dict(config) if dataclasses.is_dataclass(config) else config
    return yaml.safe_dump(redact(data), sort_keys=False)


def save_config(config: Any, path: str | Path, header: str = "") -> None:
    """Write ``header`` + :func:`dump_config` to ``path`` (atomically, mode 0600)."""
    from raycompat.io.credentials import write_private

    write_private(path, header + dump_config(config))


__getattr__, __dir__, _JOB_CONFIGS = lazy_exports(
    __name__,
    {
        "train": ("ModelSpec", "TrainConfig"),
        "fct": ("FCTSpec", "SideInfoTrainConfig", "TransformationTrainConfig"),
        "tune": ("SweepConfig",),
        "upgrade": ("UpgradeConfig",),
        "pipelines": ("RunOptions", "SourceSpec", "StoreSpec", "TransformJobConfig"),
        "serve": ("ServeJobConfig",),
    },
)

__all__ = [
    "apply_overrides",
    "bounded",
    "check_range",
    "check_ranges",
    "dump_config",
    "load_config",
    "load_yaml",
    "missing_config_file",
    "override_path",
    "parse_overrides",
    "save_config",
    "to_dict",
    *_JOB_CONFIGS,
]
