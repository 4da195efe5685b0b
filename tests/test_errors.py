"""One error hierarchy (``raycompat/errors.py``): every error class is a usage or a data error,
and the CLI and the jobs give each category its exit status (usage 2, data 1).

The classes are found by importing every module under ``raycompat/`` (old-path aliases left out),
not from a hand list, so a new error class without a category fails here.
"""

from __future__ import annotations

import importlib
import inspect
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
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == name and value not in BASES):
                found[f"{name}.{value.__qualname__}"] = value
    return found


def test_the_walk_finds_the_error_classes_of_every_layer(error_classes):
    assert len(error_classes) >= 30
    assert {"raycompat.errors.ConfigError", "raycompat.errors.StoreError",
            "raycompat.index.query.QueryError",
            "raycompat.cluster.pipelines.runner.PipelineError"} <= set(error_classes)


def test_every_error_class_is_a_usage_or_a_data_error(error_classes):
    stray = [name for name, cls in error_classes.items()
             if not issubclass(cls, (UsageError, DataError)) and name not in NOT_CATEGORIZED]
    assert not stray, f"give these a category in raycompat/errors.py terms: {stray}"
    assert set(NOT_CATEGORIZED) <= set(error_classes), "an allow-listed class no longer exists"


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("raycompat.errors.ConfigError", ValueError),
        ("raycompat.registry.UnknownNameError", KeyError),
        ("raycompat.index.query.QueryError", ValueError),
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
