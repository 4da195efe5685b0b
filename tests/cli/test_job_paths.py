"""One rule for every path of a job (raycompat/cli/job_paths.py, docs/cluster.md "Paths of a
submitted job"): outputs under the output root, inputs looked up there, then in the current
dir."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from raycompat.cli.job_paths import (
    JobPaths,
    check_output_location,
    image_inputs,
    job_paths,
    resolve_paths,
    train_inputs,
)
from raycompat.config.pipelines import SourceSpec
from raycompat.config.train import OldModelSpec, ScenarioSpec, TrainConfig
from raycompat.errors import ConfigError

SUBMITTED = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"working_dir": "."}})}


@dataclass
class Job:
    model: str = "outputs/store/_models/m1"
    base: str = "configs/base.yaml"
    files: list[str] = field(default_factory=lambda: ["s3://bucket/a.parquet", "/abs/b.parquet"])
    store: str = "outputs/galleries"


@pytest.fixture
def places(tmp_path, monkeypatch):
    """``(output root, working dir)``: the model under the root (written by an earlier job),
    the base config in the working dir (a tracked file, uploaded with it)."""
    root, work = tmp_path / "root", tmp_path / "work"
    (root / "outputs/store/_models/m1").mkdir(parents=True)
    (work / "configs").mkdir(parents=True)
    (work / "configs/base.yaml").write_text("{}\n")
    monkeypatch.chdir(work)
    return root, work


def test_inputs_resolve_against_the_output_root_then_the_working_dir(places):
    root, work = places
    cfg = resolve_paths(
        Job(), job_paths(str(root), SUBMITTED), ["store"], ["model", "base", "files.0", "files.1"]
    )
    assert cfg.model == f"{root}/outputs/store/_models/m1"  # an earlier job's output
    assert cfg.base == f"{work}/configs/base.yaml"  # uploaded with the working dir
    assert cfg.store == f"{root}/outputs/galleries"
    assert cfg.files == Job().files  # URIs and absolute paths as given


def test_an_input_found_nowhere_is_one_line_naming_the_key_and_every_place_tried(places):
    root, work = places
    with pytest.raises(ConfigError) as error:
        JobPaths(str(root), str(work)).input("transformation", "runs/h")
    assert str(error.value) == (
        f"transformation='runs/h' is relative and was not found: tried {root}/runs/h "
        f"(--output-root), {work}/runs/h (the job's working dir)"
    )
    with pytest.raises(
        ConfigError,
        match=r"model=.* tried .*/work/outputs/store/_models/m1 "
        r"\(the job's working dir\); files git ignores .* --output-root DIR",
    ):
        job_paths(None, SUBMITTED).input("model", Job().model)  # submitted, no output root


def test_run_directly_without_an_output_root_paths_stay_as_given(places):
    paths = job_paths(None, {})
    cfg = resolve_paths(Job(), paths, ["store"], ["model", "base"])
    assert cfg == Job()  # relative to the current dir; a missing model is the job's own check
    assert job_paths(None, SUBMITTED).input("base", "configs/base.yaml") == "configs/base.yaml"


def test_every_weights_file_and_image_file_of_a_config_is_an_input():
    cfg = TrainConfig(scenario=ScenarioSpec(old_model=OldModelSpec(checkpoint="old/m")))
    assert train_inputs(cfg, "training.") == [
        "training.model.weights",
        "training.scenario.old_model.checkpoint",
    ]
    images = SourceSpec(kind="parquet_images", paths=["a.parquet", "b.parquet"])
    assert image_inputs(images, "images.") == ["images.paths.0", "images.paths.1"]


def test_an_output_location_is_checked_without_writing(tmp_path):
    assert check_output_location("k", str(tmp_path)) == "exists"
    assert check_output_location("k", str(tmp_path / "a/b")) == f"new under {tmp_path}"
    assert check_output_location("k", "s3://bucket/x") == "remote, not checked"
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=r"k='.*/f/x' cannot be written: .*/f is a file"):
        check_output_location("k", str(tmp_path / "f/x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_an_output_root_that_is_a_file_is_one_line_before_anything_runs(tmp_path):
    (tmp_path / "f").write_text("")
    for root in (tmp_path / "f", tmp_path / "f/sub"):
        with pytest.raises(ConfigError) as error:
            job_paths(str(root))
        assert str(error.value) == (
            f"--output-root={str(root)!r} cannot be written: {tmp_path}/f is a file, not a folder"
        )
    assert job_paths(str(tmp_path / "new")).output_root == str(tmp_path / "new")  # made later
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_an_upgrade_run_with_an_output_root_that_is_a_file_stops_with_one_line(tmp_path, capsys):
    from raycompat.cli.errors import run_main
    from raycompat.cli.jobs.upgrade import main

    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit) as done:  # a real run (no --dry-run): before Ray starts
        run_main(main, ["--output-root", str(tmp_path / "f")])
    assert done.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    folder = tmp_path / "f"
    assert line.endswith(
        f"error: --output-root='{folder}' cannot be written: {folder} is a file, not a folder"
    )
