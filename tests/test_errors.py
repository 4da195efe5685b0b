"""One error hierarchy (``raycompat/errors.py``): every error class is a usage or a data error,
and the CLI and the jobs give each category its exit status (usage 2, data 1).

The classes are found by importing every module under ``raycompat/`` (old-path aliases left out),
not from a hand list, so a new error class without a category fails here, and so does one that
does not survive pickling (how an error raised in a Ray task or actor reaches its caller).
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import typing
from pathlib import Path

import pytest

from raycompat.cli.app import COMMANDS
from raycompat.cli.app import main as cli_main
from raycompat.cli.errors import run_main
from raycompat.data.base import CorruptDataError
from raycompat.engine import NonFiniteError
from raycompat.errors import (
    ConfigError,
    CorruptFileError,
    DataError,
    MissingStoreError,
    RaycompatError,
    StoreError,
    UsageError,
)
from raycompat.registry import UnknownNameError

ROOT = Path(__file__).resolve().parents[1]
BASES = (RaycompatError, UsageError, DataError)  # the hierarchy's own bases
# Exception classes that are deliberately neither category, each with its reason. Empty today:
# an internal control-flow signal that never reaches a user would be listed here.
NOT_CATEGORIZED: dict[str, str] = {
    # an exit status with its reason (a SystemExit), raised after the error was reported
    "raycompat.cli.job_exit.JobExit": "a SystemExit, not an error",
}


def _module_names() -> list[str]:
    names = []
    for path in sorted((ROOT / "raycompat").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.fixture(scope="module")
def error_classes() -> dict[str, type[BaseException]]:
    """``module.Class -> class`` for every exception class defined under ``raycompat/`` (the
    hierarchy's own bases left out)."""
    found = {}
    for name in _module_names():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and value not in BASES
            ):
                found[f"{name}.{value.__qualname__}"] = value
    return found


# A value of each type an error's ``__init__`` takes, to build one from its signature; a class
# whose arguments this cannot build (``module.Class -> args``) gets them by hand in ARGUMENTS,
# empty today.
VALUES: dict[object, object] = {str: "v3.json: bad digest", int: 3, list[int]: [3, 7]}
ARGUMENTS: dict[str, tuple] = {}


def representative(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` with every argument its ``__init__`` takes, message first."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name in ARGUMENTS:
        return cls(*ARGUMENTS[name])
    ours = [base for base in cls.__mro__ if issubclass(base, RaycompatError)]
    if not any("__init__" in vars(base) for base in ours):  # the built-in one: a message
        return cls(f"{cls.__name__}: what went wrong, and what to fix")
    hints = typing.get_type_hints(cls.__init__)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    missing = [p.name for p in params if hints.get(p.name) not in VALUES]
    assert not missing, f"give {name} its arguments in ARGUMENTS (no value for {missing})"
    return cls(*(VALUES[hints[p.name]] for p in params))


def assert_pickles(error: BaseException) -> None:
    """``error`` comes back from pickle with its type, message and every attribute."""
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)


@pytest.fixture(scope="module")
def raycompat_errors(error_classes) -> dict[str, type[RaycompatError]]:
    """Every :class:`RaycompatError` class under ``raycompat/``, the hierarchy's bases included."""
    found = {name: cls for name, cls in error_classes.items() if issubclass(cls, RaycompatError)}
    return found | {f"raycompat.errors.{base.__name__}": base for base in BASES}


def test_every_error_class_survives_pickling(raycompat_errors):
    """As Ray's own errors do, a class whose ``__init__`` takes more than the message (the rows of
    a ``ZeroNormError``) defines ``__reduce__``; without it unpickling calls the class with the
    message alone and fails."""
    assert "raycompat.index.distances.ZeroNormError" in raycompat_errors
    for name, cls in sorted(raycompat_errors.items()):
        error = representative(cls)
        error.add_note("raised in a Ray task")
        try:
            assert_pickles(error)
        except Exception as failure:
            raise AssertionError(f"{name} does not survive pickling: {failure!r}") from failure


class RowsWithoutReduceError(DataError):
    """ZeroNormError as it was: an argument beyond the message, and no ``__reduce__``."""

    def __init__(self, message: str, rows: list[int]):
        super().__init__(message)
        self.rows = rows


def test_the_pickle_check_fails_on_an_error_with_state_but_no_reduce():
    """Not vacuous: a class with an argument beyond the message and no ``__reduce__`` fails."""
    error = representative(RowsWithoutReduceError)
    assert error.rows == [3, 7]
    with pytest.raises(TypeError, match="rows"):
        assert_pickles(error)


def test_the_walk_finds_the_error_classes_of_every_layer(error_classes):
    assert len(error_classes) >= 30
    assert {
        "raycompat.errors.ConfigError",
        "raycompat.errors.StoreError",
        "raycompat.serving.query_inputs.QueryError",
        "raycompat.cluster.pipelines.runner.PipelineError",
    } <= set(error_classes)


def test_every_error_class_is_a_usage_or_a_data_error(error_classes):
    stray = [
        name
        for name, cls in error_classes.items()
        if not issubclass(cls, (UsageError, DataError)) and name not in NOT_CATEGORIZED
    ]
    assert not stray, f"give these a category in raycompat/errors.py terms: {stray}"
    assert set(NOT_CATEGORIZED) <= set(error_classes), "an allow-listed class no longer exists"


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("raycompat.errors.ConfigError", ValueError),
        ("raycompat.registry.UnknownNameError", KeyError),
        ("raycompat.serving.query_inputs.QueryError", ValueError),
        ("raycompat.errors.StoreError", ValueError),
        ("raycompat.data.base.CorruptDataError", ValueError),
        ("raycompat.index.distances.ZeroNormError", ValueError),
        ("raycompat.io.weights.WeightsMismatchError", ValueError),
        ("raycompat.engine.NonFiniteError", FloatingPointError),
        ("raycompat.cluster.pipelines.runner.PipelineError", RuntimeError),
    ],
)
def test_an_error_class_keeps_the_builtin_base_it_had(error_classes, name, builtin):
    """``except ValueError`` (``KeyError``...) written before the hierarchy still catches."""
    assert issubclass(error_classes[name], builtin)


def test_a_store_error_the_user_fixes_is_a_usage_error_and_still_a_store_error():
    assert issubclass(MissingStoreError, UsageError) and issubclass(MissingStoreError, StoreError)
    assert not issubclass(CorruptFileError, UsageError)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigError("seed: expected int, got 'abc'"), 2),
        (UnknownNameError("unknown method 'bogus'; registered: bct"), 2),
        (MissingStoreError("no store at /tmp/sotre"), 2),  # a StoreError too: usage wins
        (CorruptFileError("v1.json: not valid JSON"), 1),
        (CorruptDataError("train.bin: bad magic"), 1),
        (NonFiniteError("epoch 1 step 3: loss is nan"), 1),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_run_main_gives_each_category_its_exit_status(error, status, capsys, monkeypatch):
    monkeypatch.delenv("RAYCOMPAT_DEBUG", raising=False)

    def failing(argv):
        raise error

    with pytest.raises(SystemExit) as exit_:
        run_main(failing, [])
    assert exit_.value.code == status
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(f"error: {error}")
    with pytest.raises(type(error)):
        run_main(failing, ["--debug"])


def test_run_main_leaves_other_exceptions_their_traceback(monkeypatch):
    monkeypatch.delenv("RAYCOMPAT_DEBUG", raising=False)

    def bug(argv):
        raise ValueError("a bug, not a RaycompatError")

    with pytest.raises(ValueError):
        run_main(bug, [])


@pytest.mark.parametrize(
    ("error", "status"),
    [(UsageError("no gallery 'faecs'"), 2), (DataError("v2.json: corrupt"), 1)],
    ids=["usage", "data"],
)
def test_the_cli_maps_an_error_to_its_exit_status_by_type(error, status, capsys, monkeypatch):
    monkeypatch.delenv("RAYCOMPAT_DEBUG", raising=False)

    def failing(args):
        raise error

    monkeypatch.setitem(COMMANDS, "models", failing)
    assert cli_main(["models", "--store", "unused"]) == status
    assert capsys.readouterr().err == f"raycompat: error: {error}\n"
    with pytest.raises(RaycompatError):
        cli_main(["models", "--store", "unused", "--debug"])
