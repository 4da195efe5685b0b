"""The jobs' shared preamble (raycompat/cli/job_entry.py) and config overrides into lists."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from raycompat.cli.job_entry import announce_outputs, job_config, job_parser
from raycompat.cli.job_paths import job_paths, resolve_paths
from raycompat.config import load_config, override_path
from raycompat.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SUBMITTED = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"working_dir": "."}})}


@dataclass
class Step:
    name: str = "m"
    epochs: int = 1


@dataclass
class Store:
    root: str = "outputs/store"
    gallery: str = "g"


@dataclass
class History:
    store: Store = field(default_factory=Store)
    steps: list[Step] = field(default_factory=lambda: [Step("m1"), Step("m2", 3)])
    report_dir: str = "outputs/report"


def test_override_paths_take_dots_and_brackets():
    assert override_path("steps.0.epochs") == ["steps", "0", "epochs"]
    assert override_path("steps[1].epochs") == ["steps", "1", "epochs"]
    with pytest.raises(ConfigError, match="empty part"):
        override_path("steps..epochs")


def test_overrides_reach_list_entries_and_keep_the_rest():
    cfg = load_config(History, None, ["steps.0.epochs=5", "steps[1].name=m9"])
    assert cfg.steps == [Step("m1", 5), Step("m9", 3)]
    with pytest.raises(ConfigError, match=r"'2' is not an index of that list \(it has 2 entries"):
        load_config(History, None, ["steps.2.epochs=1"])
    with pytest.raises(ConfigError, match=r"'x' is not an index"):
        load_config(History, None, ["steps.x.epochs=1"])
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) steps\[0\]\.nope"):
        load_config(History, None, ["steps.0.nope=1"])


def test_a_section_override_merges_into_the_section():
    cfg = load_config(History, None, ["store={root: /data}"])
    assert cfg.store == Store("/data", "g")


def test_relative_outputs_are_refused_in_a_submitted_jobs_working_dir_copy():
    keys = ("store.root", "report_dir")

    def resolve(cfg, root, environ):
        return resolve_paths(cfg, job_paths(root, environ), keys)

    with pytest.raises(
        ConfigError,
        match=r"store.root='outputs/store' is relative, and this job "
        r"runs in Ray's temporary copy .* --output-root DIR",
    ):
        resolve(History(), None, SUBMITTED)
    cfg = resolve(History(), "/data/out", SUBMITTED)
    assert cfg.store.root == "/data/out/outputs/store"
    assert cfg.report_dir == "/data/out/outputs/report"
    kept = History(store=Store("s3://bucket/store"), report_dir="/abs/report")
    assert resolve(kept, None, SUBMITTED) == kept  # absolute and s3:// stay
    assert resolve(History(), None, {}) == History()  # not submitted: as given
    not_copied = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {}})}
    assert resolve(History(), None, not_copied) == History()


def test_dry_run_checks_every_location_prints_the_plan_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAYCOMPAT_OUTPUT_ROOT", raising=False)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "h.yaml").write_text("report_dir: reports/r1\n")
    args = job_parser("Doc.", "History").parse_args(["--config", "configs/h.yaml", "--dry-run"])
    cfg = job_config(History, args, default="the defaults", outputs=("store.root", "report_dir"))
    with pytest.raises(SystemExit) as done:
        announce_outputs(cfg, ("store.root", "report_dir"), dry_run=True)
    assert done.value.code == 0
    plan = capsys.readouterr().out.splitlines()
    assert plan[0].startswith("dry run:")
    assert f"  output report_dir={tmp_path}/reports/r1 (new under {tmp_path})" in plan
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configs"]  # nothing written
    (tmp_path / "outputs").write_text("a file where a folder should be")
    with pytest.raises(
        ConfigError,
        match=r"store.root='outputs/store' cannot be written: .*"
        r"outputs is a file, not a folder",
    ):
        announce_outputs(cfg, ("store.root",), dry_run=True)


def test_print_config_prints_the_merged_config_and_exits(capsys):
    args = job_parser("Doc.", "History").parse_args(["--print-config", "steps.1.epochs=7"])
    with pytest.raises(SystemExit) as done:
        job_config(History, args, default="the defaults", outputs=("report_dir",))
    assert done.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["steps"][1] == {"name": "m2", "epochs": 7}


def test_a_job_without_config_says_which_default_it_runs(caplog):
    args = job_parser("Doc.", "History").parse_args([])
    with caplog.at_level(logging.INFO, logger="raycompat.jobs"):
        cfg = job_config(History, args, default="the History defaults", outputs=("report_dir",))
        announce_outputs(cfg, ("report_dir",))
    assert "no --config given: running the History defaults" in caplog.text
    assert "outputs: report_dir=outputs/report" in caplog.text


@pytest.mark.parametrize("job", ["train", "tune", "transform", "upgrade"])
def test_every_job_documents_the_shared_options(job):
    out = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / f"{job}.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for option in ("--config", "--print-config", "--output-root", "--dry-run", "--debug"):
        assert option in out, (job, option)


def test_a_submitted_upgrade_with_relative_outputs_stops_with_one_line(tmp_path):
    env = {**os.environ, **SUBMITTED}
    env.pop("RAYCOMPAT_OUTPUT_ROOT", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "upgrade.py"), "--print-config"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "store.root='outputs/upgrade/store' is relative" in errors[0]
    assert "Traceback" not in done.stderr


@dataclass
class Data:
    options: dict = field(default_factory=lambda: {"per_class": 3})


@dataclass
class WithOptions:
    data: Data = field(default_factory=Data)


def test_a_later_mapping_override_replaces_an_earlier_one_and_merges_into_the_defaults():
    """As before list entries were reachable: overrides of one key replace each other, and the
    result is merged into the file's and defaults' mapping (test_train_ray relies on it)."""
    cfg = load_config(WithOptions, None, ["data.options={a: 1}", "data.options={b: 2}"])
    assert cfg.data.options == {"per_class": 3, "b": 2}


def test_print_config_validates_the_merged_config_as_a_run_does(capsys):
    from raycompat.cli.errors import run_main
    from raycompat.cli.jobs.upgrade import main

    with pytest.raises(SystemExit) as done:
        run_main(main, ["--print-config", "upgrades.1.method=dsimplex_hocc"])
    assert done.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing printed as if the config were valid
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert "upgrades[1].method: unknown compatibility method 'dsimplex_hocc'" in line
    assert line.endswith("did you mean 'dsimplex_hoc'?")
    with pytest.raises(SystemExit) as done:  # the valid config still prints
        run_main(main, ["--print-config", "upgrades.1.method=dsimplex_hoc"])
    assert done.value.code == 0 and "dsimplex_hoc" in capsys.readouterr().out
