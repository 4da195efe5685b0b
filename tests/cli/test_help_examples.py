"""Every example command in a job's ``--help`` (``examples:``) loads: its config file exists and
its overrides name real keys with valid values (issue 40: ``raycompat-tune ... epochs=2`` was
shown and rejected). Each line goes through the job's own ``main`` with ``--print-config``
(load, type-check, resolve outputs), then the cheap checks the job makes before Ray; no Ray,
no torch."""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path

import pytest
import yaml

from raycompat.config import load_config, load_yaml
from raycompat.config.train import TrainConfig
from raycompat.config.upgrade import UpgradeConfig, check_upgrade_config

ROOT = Path(__file__).resolve().parents[2]
JOBS = ("train", "transform", "tune", "upgrade", "deploy")


def help_examples(job: str, capsys) -> list[list[str]]:
    """The argument lists of the ``raycompat-<job> ...`` lines of the job's ``--help``."""
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(f"raycompat.cli.jobs.{job}").main(["--help"])
    assert stop.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    script = f"raycompat-{job}"
    return [
        shlex.split(line, comments=True)[1:]
        for line in lines
        if line.strip().split(" ")[0] == script
    ]


def printed_config(job: str, argv: list[str], capsys) -> dict:
    """What ``raycompat-<job> ARGV --print-config`` prints (the merged, validated config)."""
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(f"raycompat.cli.jobs.{job}").main([*argv, "--print-config"])
    assert stop.value.code == 0, argv
    return load_yaml(capsys.readouterr().out)


def _sweep_base_loads(printed: dict, tmp_path: Path) -> None:
    # The sweep's overrides are training keys: every trial's config must take them.
    load_config(TrainConfig, printed["base"], printed["overrides"])


def _upgrade_checks(printed: dict, tmp_path: Path) -> None:
    # The job checks the config it loaded (methods, options, classes) before torch and Ray.
    merged = tmp_path / "merged.yaml"
    merged.write_text(yaml.safe_dump(printed))
    check_upgrade_config(load_config(UpgradeConfig, merged))


LATER_CHECKS = {"tune": _sweep_base_loads, "upgrade": _upgrade_checks}


@pytest.mark.parametrize("job", JOBS)
def test_every_help_example_loads_its_config(job, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the examples name configs/ from the checkout
    examples = help_examples(job, capsys)
    assert len(examples) >= 2, f"raycompat-{job} --help shows no examples"
    for argv in examples:
        printed = printed_config(job, argv, capsys)
        LATER_CHECKS.get(job, lambda *_: None)(printed, tmp_path)


def test_a_wrong_example_fails_the_check(capsys, monkeypatch):
    """Not vacuous: the example the tune job's help showed before (``epochs=2``, a training
    key) is refused by the same path, naming where a training key goes."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(Exception, match=r"unknown config key\(s\) epochs; .*overrides=\["):
        printed_config("tune", ["epochs=2"], capsys)
