"""The jobs' recipes live in the package (``raycompat/cli/jobs/``) and are console scripts;
``jobs/*.py`` are thin wrappers around them (issue 23, item 4: after ``pip install`` alone there
was no way to run the upgrade)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from raycompat.cli.jobs import upgrade

ROOT = Path(__file__).resolve().parents[2]
JOBS = ("upgrade", "train", "transform", "tune", "deploy")


def scripts() -> dict[str, str]:
    return {
        e.name: e.value
        for e in importlib.metadata.entry_points(group="console_scripts")
        if e.name.startswith("raycompat")
    }


@pytest.mark.parametrize("job", JOBS)
def test_each_job_is_an_installed_console_script_and_jobs_py_wraps_it(job):
    assert scripts()[f"raycompat-{job}"] == f"raycompat.cli.jobs.{job}:run"
    module = importlib.import_module(f"raycompat.cli.jobs.{job}")
    spec = importlib.util.spec_from_file_location(f"_wrapper_{job}", ROOT / "jobs" / f"{job}.py")
    wrapper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wrapper)
    assert wrapper.main is module.main and callable(module.run)


def test_the_upgrade_script_answers_help_naming_its_default_config():
    """As installed by ``pip install -e .`` (the script next to this Python)."""
    script = Path(sys.executable).with_name("raycompat-upgrade")
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: raycompat-upgrade ")
    assert " ".join(done.stdout.split()).count(" ".join(upgrade.DEFAULT.split())) == 1
    assert "configs/upgrade_mnist.yaml" in upgrade.DEFAULT


def test_the_wrapper_runs_as_a_script_with_one_line_errors(tmp_path):
    """``python jobs/upgrade.py`` (what ``ray job submit`` runs) from another directory: the
    wrapper finds the package and ``run_main`` prints a config error as one line, exit 2."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "upgrade.py"), "upgrades.0.epochs=0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("upgrade.py: error: upgrades")
