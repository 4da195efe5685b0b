"""Schema checks for the store's JSON records: version records, model records, query grants.

A record is a small JSON file that anything with write access to the store can change, so every
record is checked when it is read, against the dataclass it is parsed into: a JSON object, with
every field that has no default present, no unknown key, and each value of the JSON type the
field is annotated with (``int`` is not ``bool``; ``float`` accepts an int). Range and meaning
checks (``rows >= 0``, a known relation) stay with each record class. A bad record raises
:class:`CorruptFileError` naming the file and the key, never a ``TypeError`` from deep inside.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from raycompat.errors import CorruptFileError

_NAMES = {
    str: "a string",
    int: "an int",
    bool: "a bool",
    float: "a number",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def load_object(data: bytes, source: str, what: str) -> dict:
    """``data`` parsed as a JSON object; ``what`` (``"model record"``) names it in errors."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptFileError(f"{source}: {what} is not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise CorruptFileError(f"{source}: {what} is not a JSON object")
    return raw


def _matches(value: Any, annotation: Any) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if origin is list:
        return type(value) is list and all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return type(value) is dict
    if annotation is float:
        return type(value) in (int, float)
    return type(value) is annotation


def _describe(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin is list:
        return f"a list of {_describe(args[0]).split(' ', 1)[1]}s"
    return _NAMES.get(origin or annotation, repr(annotation))


def check_record(raw: dict, cls: type, source: str, what: str) -> None:
    """Raise :class:`CorruptFileError` unless ``raw`` fits the dataclass ``cls``: its required
    fields present, no unknown key, every value of its field's annotated type."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    missing = sorted(
        name
        for name, f in fields.items()
        if name not in raw
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise CorruptFileError(f"{source}: {what} lacks key(s) {', '.join(missing)}")
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise CorruptFileError(
            f"{source}: {what} has unknown key(s) {', '.join(map(str, unknown))}; "
            f"valid keys: {', '.join(fields)}"
        )
    hints = typing.get_type_hints(cls)
    for name, value in raw.items():
        if not _matches(value, hints[name]):
            raise CorruptFileError(
                f"{source}: {what} key {name!r} must be {_describe(hints[name])}, "
                f"got {_short(value)}"
            )


def check_choice(raw: dict, key: str, choices: tuple[str, ...], source: str, what: str) -> None:
    """Raise :class:`CorruptFileError` unless ``raw[key]`` is one of ``choices``."""
    if raw[key] not in choices:
        raise CorruptFileError(
            f"{source}: {what} key {key!r} must be one of {', '.join(choices)}, got {raw[key]!r}"
        )


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
