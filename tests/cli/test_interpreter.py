"""A job run by a Python without raycompat's requirements is one line naming that Python and
the fix, exit 2 (raycompat/cli/interpreter.py; issue 52, item 5b)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from raycompat.cli.errors import run_main
from raycompat.cli.interpreter import job_module, missing_requirement

ROOT = Path(__file__).resolve().parents[2]


def blocked(monkeypatch, name: str) -> None:
    """``import name`` raises ModuleNotFoundError from now on (as in a Python without it)."""
    monkeypatch.setitem(sys.modules, name, None)


def test_a_requirement_missing_inside_a_jobs_main_is_one_line_and_exit_2(monkeypatch, capsys):
    blocked(monkeypatch, "raycompat_test_requirement")

    def main(argv):
        import raycompat_test_requirement  # noqa: F401

    with pytest.raises(SystemExit) as exit_:
        run_main(main, [])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert f"this Python ({sys.executable}) cannot import raycompat_test_requirement" in err[0]
    assert "source .venv/bin/activate" in err[0] and "Which Python runs the job" in err[0]


def test_a_missing_raycompat_module_is_a_bug_with_its_traceback(monkeypatch):
    def main(argv):
        import raycompat.no_such_module  # noqa: F401

    with pytest.raises(ModuleNotFoundError, match="raycompat.no_such_module"):
        run_main(main, [])
    assert missing_requirement(ModuleNotFoundError("x", name="raycompat.x")) is None
    assert missing_requirement(ModuleNotFoundError("x")) is None  # no name: not ours to say


def test_a_job_module_whose_imports_fail_is_one_line_and_exit_2(monkeypatch, capsys):
    from raycompat.cli import interpreter

    def import_module(name: str):  # the job modules import yaml at module level
        assert name == "raycompat.cli.jobs.train"
        raise ModuleNotFoundError("No module named 'yaml'", name="yaml")

    monkeypatch.setattr(interpreter, "import_module", import_module)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with pytest.raises(SystemExit) as exit_:
        job_module("train")
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("train.py: error: this Python (") and "cannot import yaml" in err[0]


def base_python() -> str | None:
    """The interpreter the venv was made from, where it lacks Ray (the machine's own Python,
    which a shell without the venv finds as ``python``); else None."""
    for candidate in (Path(sys.base_prefix) / "bin" / "python3", Path("/usr/bin/python3")):
        if candidate.is_file() and Path(sys.prefix) != Path(sys.base_prefix):
            lacks = subprocess.run([str(candidate), "-c", "import ray"], capture_output=True)
            if lacks.returncode != 0:
                return str(candidate)
    return None


def test_the_train_job_under_the_machines_own_python_says_which_python_and_the_fix():
    """What a submitted job's ``python`` is when ``ray start`` ran outside the venv."""
    python = base_python()
    if python is None:
        pytest.skip("no Python without Ray beside this venv")
    done = subprocess.run(
        [python, "jobs/train.py", "--config", "configs/train_mnist_cores.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr
    assert lines[-1].startswith(f"train.py: error: this Python ({python}) cannot import "), lines
    assert "source .venv/bin/activate" in lines[-1]
