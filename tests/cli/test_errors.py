"""Errors of the ``raycompat`` CLI and the jobs are one line naming what to fix.

Corrupt catalog records are listed beside the readable ones (exit 1), a mistyped store is not an
empty one (exit 2), config mistakes in a job are one line naming the file and the key (exit 2),
and ``--debug`` brings the traceback back.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from raycompat.cli.app import main
from raycompat.cli.errors import run_main
from raycompat.errors import ConfigError, MissingStoreError
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path):
    """Gallery ``faces`` with v1 and v2 (model m1), m1 registered and granted v2."""
    store = GalleryStore(str(tmp_path / "store"))
    for version in ("v1", "v2"):
        info = VersionInfo(version, "m1", 4, False, f"{version} = extract(m1)")
        staging = store.begin("faces", info, staging_name="t")
        rows = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
        staging.write_table(embedding_table(["a", "b", "c"], rows), "part-0.parquet")
        staging.commit(expected_rows=3)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", "/models/m1", 4, method="independent"))
    catalog.grant(QueryGrant("faces", "v2", "m1", "extracted"))
    return store


def cli(capsys, *argv) -> tuple[int, str, list[str]]:
    """Exit status, stdout (JSON) and the lines of stderr."""
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def corrupt(path: str, **change) -> None:
    raw = json.loads(Path(path).read_text())
    Path(path).write_text(json.dumps({**raw, **change}))


def test_a_corrupt_version_record_is_marked_and_the_others_listed(store, capsys):
    corrupt(store.path("faces", "_versions", "v1.json"), rows="lots")
    code, out, err = cli(capsys, "versions", "faces", "--store", store.uri())
    listing = json.loads(out)
    assert code == 1
    assert [v["version"] for v in listing["versions"]] == ["v2"]
    assert listing["versions"][0]["queried_by"] == ["m1"]
    ((marked),) = listing["corrupt"]
    assert marked["file"] == store.uri("faces", "_versions", "v1.json")
    assert "version record key 'rows' must be an int, got 'lots'" in marked["error"]
    (line,) = err
    assert line.startswith("raycompat: error: corrupt record skipped: ")
    assert "_versions/v1.json" in line and "'rows'" in line


def test_a_corrupt_grant_is_marked_in_versions(store, capsys):
    corrupt(store.path("faces", "_queries", "m1.json"), relation="friends")
    code, out, err = cli(capsys, "versions", "faces", "--store", store.uri())
    listing = json.loads(out)
    assert code == 1 and [v["queried_by"] for v in listing["versions"]] == [[], []]
    (line,) = err
    assert "faces/_queries/m1.json: query grant key 'relation'" in line
    assert not any("Traceback" in e for e in err)


def test_a_corrupt_model_record_is_one_line_naming_the_file(store, capsys):
    corrupt(store.path("_models", "m1.json"), embed_dim="four")
    code, out, err = cli(capsys, "models", "--store", store.uri())
    assert code == 1 and json.loads(out)["models"] == []
    (line,) = err
    assert f"{store.uri('_models', 'm1.json')}: model record key 'embed_dim'" in line
    Path(store.path("_models", "m1.json")).write_text("{half a record")
    code, out, err = cli(
        capsys, "search", "faces", __file__, "--store", store.uri(), "--model", "m1"
    )
    assert (code, out) == (1, "")
    (line,) = err
    assert line.startswith("raycompat: error: ")
    assert "m1.json: model record is not valid JSON" in line


@pytest.mark.parametrize("command", [["models"], ["versions", "faces"]])
def test_a_missing_store_is_a_usage_error(tmp_path, capsys, command):
    typo = tmp_path / "sotre"
    code, out, err = cli(capsys, *command, "--store", str(typo))
    assert (code, out) == (2, "")
    assert err == [f"raycompat: error: no store at {typo}: the folder does not exist"]
    assert not typo.exists()


def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    with pytest.raises(MissingStoreError):
        main(["--debug", "models", "--store", str(tmp_path / "sotre")])
    with pytest.raises(MissingStoreError):
        main(["models", "--store", str(tmp_path / "sotre"), "--debug"])
    monkeypatch.setenv("RAYCOMPAT_DEBUG", "1")
    with pytest.raises(MissingStoreError):
        main(["models", "--store", str(tmp_path / "sotre")])


def test_run_main_catches_config_errors_only(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAYCOMPAT_DEBUG", raising=False)
    config = tmp_path / "job.yaml"
    config.write_text("seed: 1\n")

    def bad_key(argv):
        raise ConfigError("upgrades[0].method: unknown compatibility method 'bogus'")

    with pytest.raises(SystemExit) as exit_:
        run_main(bad_key, ["--config", str(config)])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        f"error: {config}: upgrades[0].method: unknown compatibility method 'bogus'"
    )
    with pytest.raises(SystemExit) as exit_:
        run_main(bad_key, ["--config", str(tmp_path / "nope.yaml")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith(  # and the nearest file in that folder
        f"config file {tmp_path / 'nope.yaml'} does not exist; did you mean {str(config)!r}?\n"
    )
    with pytest.raises(ConfigError):
        run_main(bad_key, ["--config", str(config), "--debug"])

    def bug(argv):
        raise KeyError("a bug keeps its traceback")

    with pytest.raises(KeyError):
        run_main(bug, [])
    seen = []
    run_main(seen.append, ["--config", str(config), "a=1", "--debug"])
    assert seen == [["--config", str(config), "a=1"]]  # --debug is not passed on


def job(script: str, config: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAYCOMPAT_DEBUG"}
    return subprocess.run(
        [sys.executable, str(REPO / "jobs" / script), "--config", str(config), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "yaml", "overrides", "names"),
    [
        ("transform.py", "mode: transform\n", ["bogus.key=1"], "unknown config key(s) bogus"),
        ("transform.py", "seed: abc\n", [], "seed: expected int, got 'abc'"),
        (
            "upgrade.py",
            "upgrades: [{model_version: m1, classes: 4, method: bogus}]\n",
            [],
            "upgrades[0].method: unknown compatibility method 'bogus'",
        ),
    ],
)
def test_a_job_config_error_is_one_line_naming_the_file_and_key(
    tmp_path, script, yaml, overrides, names
):
    config = tmp_path / "job.yaml"
    config.write_text(yaml)
    result = job(script, config, *overrides)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"{script}: error: {config}: ") and names in line


@pytest.mark.slow
def test_a_job_with_debug_shows_the_traceback(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("mode: transform\n")
    result = job("transform.py", config, "bogus.key=1", "--debug")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "ConfigError" in result.stderr


# ---- Ctrl-C (issue 40, item 7; issue 52, item 1) -----------------------------------------------

SLEEPER = """
import sys, time
from raycompat.cli.errors import run_main

def main(argv):
    print("ready", flush=True)
    time.sleep(60)

run_main(main, resumes="rerunning resumes from the last checkpoint")
"""
# The ``raycompat`` command, its handler waiting as a long command waits.
COMMAND_SLEEPER = """
import sys, time
from raycompat.cli import app

def models(args):
    print("ready", flush=True)
    time.sleep(60)

app.COMMANDS["models"] = models
sys.exit(app.main(["models", "--store", "."]))
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def user_env() -> dict[str, str]:
    """The environment a user runs a job in: no ``--debug``, and no Ray address but the one
    a command names (the session's Ray sets one)."""
    return {k: v for k, v in os.environ.items() if k not in ("RAYCOMPAT_DEBUG", "RAY_ADDRESS")}


def interrupted(
    command: list[str], ready, timeout: float = 120, ignored: bool = False
) -> tuple[int, list[str]]:
    """Start ``command``, wait until ``ready(line)`` holds for a line of its stderr (or of its
    stdout, for a ``ready`` named ``stdout``; the other stream is dropped), send SIGINT:
    ``(exit status, the stderr lines printed after the signal)``. ``ignored``: started with
    SIGINT ignored, as a shell without job control starts ``command &``."""
    on_stdout = ready.__name__ == "stdout"
    proc = subprocess.Popen(  # stdout unread would fill its pipe (Tune's tables) and block
        command,
        cwd=REPO,
        stdout=subprocess.PIPE if on_stdout else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=user_env(),
        preexec_fn=_ignore_sigint if ignored else None,
    )
    try:
        stream = proc.stdout if on_stdout else proc.stderr
        seen = []
        for line in stream:
            seen.append(line)
            if ready(line):
                break
        else:
            raise AssertionError(f"{command} ended before it was ready: {proc.wait()}: {seen}")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err.splitlines()


@pytest.mark.parametrize(
    ("program", "line"),
    [
        (SLEEPER, "-c: interrupted; rerunning resumes from the last checkpoint"),
        (COMMAND_SLEEPER, "raycompat: interrupted; rerunning starts it again"),
    ],
    ids=["job", "command"],
)
@pytest.mark.parametrize("ignored", [False, True], ids=["foreground", "started_ignoring_sigint"])
def test_ctrl_c_in_a_job_or_command_is_one_line_and_exit_130(program, line, ignored):
    def stdout(line: str) -> bool:
        return line.strip() == "ready"

    code, lines = interrupted([sys.executable, "-c", program], stdout, ignored=ignored)
    assert code == 130, lines
    assert lines == [line], lines


def test_ctrl_c_in_a_command_is_one_line_naming_what_a_rerun_does(store, capsys, monkeypatch):
    """``raycompat``: one line, exit 130, no traceback (``--debug`` shows it); a command
    that writes says what a rerun does (``Command.resumes``)."""
    from raycompat.cli import app

    def ctrl_c(args):
        raise KeyboardInterrupt

    for name in ("versions", "index"):
        monkeypatch.setitem(app.COMMANDS, name, ctrl_c)
    code, out, err = cli(capsys, "versions", "faces", "--store", store.uri())
    assert (code, out, err) == (130, "", ["raycompat: interrupted; rerunning starts it again"])
    code, out, err = cli(capsys, "index", "build", "faces", "--version", "v1", "--store",
                         store.uri())  # fmt: skip
    assert (code, out) == (130, "")
    assert err == [
        "raycompat: interrupted; an index is published only once built and measured; rerunning "
        "the same command builds it again, keeping the shards a sharded_ivf build finished"
    ]
    with pytest.raises(KeyboardInterrupt):
        main(["versions", "faces", "--store", store.uri(), "--debug"])


EXPORT_READING_SLOWLY = """
import sys, time
from raycompat.cli.app import main
from raycompat.store.gallery import GalleryStore

read = GalleryStore.iter_batches

def slowly(self, *args, **kwargs):  # the second batch comes 3 s late: time to press Ctrl-C
    for number, batch in enumerate(read(self, *args, **kwargs)):
        if number == 1:
            print("reading", file=sys.stderr, flush=True)
            time.sleep(3)
        yield batch

GalleryStore.iter_batches = slowly
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_during_a_delta_export_is_one_line_and_the_rerun_exports(tmp_path):
    """SIGINT while the export has written its first file (issue 52, item 1, for ``export``):
    one line, exit 130, the table folder it created gone, and the same command exports."""
    from tests.store.formats.test_export import publish

    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", 40)  # two files: two batches
    target = tmp_path / "t"
    argv = ["export", "faces", str(target), "--store", store.root, "--version", "v1",
            "--format", "delta"]  # fmt: skip

    def stderr(line: str) -> bool:
        return line.strip() == "reading"

    code, lines = interrupted([sys.executable, "-c", EXPORT_READING_SLOWLY, *argv], stderr)
    assert (code, lines) == (130, [
        "raycompat: interrupted; a table this export created is removed; rerunning the same "
        "command exports again (with --mode overwrite over a Delta table that was there before)"
    ])  # fmt: skip
    assert not target.exists()
    assert main(argv) == 0 and target.is_dir()


@pytest.mark.slow
def test_ctrl_c_during_the_demo_is_one_line_and_exit_130(tmp_path):
    """``python jobs/demo.py`` interrupted while it trains its first model."""

    def stderr(line: str) -> bool:
        return "[1/" in line and "training on" in line

    command = [sys.executable, "jobs/demo.py", "methods=[ift]", "epochs=200", "threads=1",
               f"output_dir={tmp_path}"]  # fmt: skip
    code, lines = interrupted(command, stderr)
    assert code == 130, lines
    assert len(lines) <= 2, lines  # an epoch line may come before the signal lands
    assert lines[-1] == (
        "demo.py: interrupted; rerunning starts the demo again (it stores no progress)"
    ), lines


# Every stage of every job, started as a user starts it and interrupted while it runs (issue
# 52, item 1): each case writes its tiny inputs under ``tmp`` and gives the command, the regex
# of the stderr line that shows the stage at work, and what must hold afterwards (nothing
# published; the rerun resumes). Jobs join the session's Ray (``address``), as on a cluster;
# the upgrade job's training starts a private one, SIGINT ignored as a script's ``job &`` starts
# it (it went on past the signal and trained every model).


Fixture = Callable[[str], object]  # pytest's request.getfixturevalue: a session fixture by name


@dataclass
class Stage:
    command: list[str]
    ready: str
    line: str  # how the one line starts
    check: Callable[[list[str]], None] = lambda lines: None  # given the lines after the signal
    ignored: bool = False


def job_config(tmp: Path, **config) -> str:
    (tmp / "job.yaml").write_text(yaml.safe_dump(config))
    return str(tmp / "job.yaml")


def train_stage(tmp: Path, address: str, fixture: Fixture) -> Stage:
    """The tiny history (the demo's job on toy data: its first epoch takes a second, not the
    demo's minute), trained to its validation plateau as the demo is (at least 3 epochs, so
    the signal lands inside m1's training), interrupted after m1's first epoch; it starts its
    own private Ray."""
    from tests.cluster.upgrade.test_job import tiny_config

    command = [sys.executable, "jobs/upgrade.py", "--config", str(tiny_config(tmp)),
               "training.epochs=200", "training.stop.rule=plateau",
               "training.stop.patience=1", "training.stop.min_epochs=3"]  # fmt: skip

    def the_rerun_resumes_m1(lines: list[str]) -> None:
        import pyarrow.fs as pafs

        from raycompat.cluster.train.task_run import read_record

        assert not [line for line in lines if "[2/2]" in line], lines
        # what the same command resumes from: m1's epochs so far, each recorded with its
        # checkpoint before its line is printed
        (step,) = (tmp / "runs").glob("toy-m1-*/step_1")
        kept = [entry["dir"] for entry in read_record(pafs.LocalFileSystem(), str(step))]
        assert kept and all(name.startswith("checkpoint_epoch") for name in kept), kept
        assert all((step / name).is_dir() for name in kept), kept
        rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                               env=user_env(), timeout=300)  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr
        # m1 resumed from the last epoch it recorded (its number as the epoch lines count)
        resumed = re.search(r"toy-m1-\S*/step_1: resumed after epoch (\d+) ", rerun.stderr)
        assert resumed and int(resumed.group(1)) >= 1, rerun.stderr
        after = int(resumed.group(1))
        assert f"step_1 epoch {after + 1}/200" in rerun.stderr  # the next epoch, not 1/200
        assert "step_1 epoch 1/200" not in rerun.stderr, rerun.stderr  # m1 not trained again
        store = GalleryStore(str(tmp / "store"))
        assert [v.version for v in store.versions("digits")] == ["v1"], rerun.stderr
        assert [m.model_version for m in Catalog(store).models()] == ["m1"], rerun.stderr

    line = "upgrade.py: interrupted; rerunning the same command resumes"
    return Stage(command, "(?=.*m1)(?=.*epoch 1/)", line, the_rerun_resumes_m1, ignored=True)


def extract_stage(tmp: Path, address: str, fixture: Fixture) -> Stage:
    from tests.cluster.pipelines.test_pipelines import exported_lenet

    images = {"num_classes": 10, "images_per_class": 80, "image_size": 32, "seed": 3}
    config = job_config(
        tmp,
        mode="extract",
        store={"root": str(tmp / "store"), "gallery": "syn"},
        model=exported_lenet(tmp / "model"),
        images={"kind": "dataset", "name": "synthetic", "options": images},
        target={"version": "v1", "model_version": "lenet", "width": 8, "normalized": True},
        run={"rows_per_file": 50, "batch_size": 50, "actors": 1, "progress_every_s": 0},
        ray_address=address,
    )
    command = [sys.executable, "jobs/transform.py", "--config", config]

    def the_rerun_resumes(lines: list[str]) -> None:
        assert GalleryStore(str(tmp / "store")).versions("syn") == []  # nothing published
        rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                               env=user_env(), timeout=300)  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr
        kept = re.search(r"extract syn/v1: \d+ / 800 rows \(\d+\.\d%, (\d+) from an earlier run",
                         rerun.stderr)  # fmt: skip
        assert kept and 0 < int(kept.group(1)) < 800, rerun.stderr  # kept, not redone
        assert GalleryStore(str(tmp / "store")).version("syn", "v1").rows == 800

    line = "transform.py: interrupted; rerunning the same command resumes from the parts"
    return Stage(command, r"extract syn/v1: \d+ / 800 rows", line, the_rerun_resumes)


def transform_stage(tmp: Path, address: str, fixture: Fixture) -> Stage:
    from tests.cluster.pipelines.test_pipelines import make_source, random_models

    make_source(tmp / "store", "g", 60_000, 3, 1000)
    h_dir, g_dir = random_models(tmp)
    config = job_config(
        tmp,
        mode="transform",
        store={"root": str(tmp / "store"), "gallery": "g"},
        source_version="v1",
        transformation=h_dir,
        side_info_transformation=g_dir,
        target={"version": "v2", "model_version": "m2", "width": 16, "side_info_width": 8},
        run={"rows_per_file": 3000, "actors": 1, "progress_every_s": 0},
        ray_address=address,
    )
    command = [sys.executable, "jobs/transform.py", "--config", config]

    def the_rerun_resumes(lines: list[str]) -> None:
        assert GalleryStore(str(tmp / "store")).versions("g")[-1].version == "v1"
        rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                               env=user_env(), timeout=300)  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr
        skipped = re.search(r"rows_skipped=(\d+) ", rerun.stderr)
        assert skipped and 0 < int(skipped.group(1)) < 60_000, rerun.stderr  # kept, not redone
        assert GalleryStore(str(tmp / "store")).version("g", "v2").rows == 60_000

    line = "transform.py: interrupted; rerunning the same command resumes from the parts"
    return Stage(command, r"transform g/v1 -> v2: \d+ / 60000 rows", line, the_rerun_resumes)


def backfill_stage(tmp: Path, address: str, fixture: Fixture) -> Stage:
    """A copy of the session's tiny history (m2 refused), backfilled by re-extraction on
    request: m1 and m2 stand decided, so the rerun goes straight to m2's backfill."""
    from tests.cluster.upgrade.test_job import tiny_config

    root, _ = fixture("tiny_history")
    shutil.copytree(root / "a", tmp, dirs_exist_ok=True)
    config = str(tiny_config(tmp))

    command = [sys.executable, "jobs/upgrade.py", "--config", config, "--address", address,
               "policy.on_incompatible=backfill"]  # fmt: skip

    def the_rerun_backfills(lines: list[str]) -> None:
        store = GalleryStore(str(tmp / "store"))
        assert [v.version for v in store.versions("digits")] == ["v1"], lines  # not m2's v2
        rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                               env=user_env(), timeout=300)  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr
        v1, v2 = store.versions("digits")  # m2's backfill published once, every row
        assert (v2.version, v2.model_version, v2.rows) == ("v2", "m2", v1.rows), rerun.stderr
        assert Catalog(store).grant_of("digits", "m2").gallery_version == "v2"

    line = "upgrade.py: interrupted; rerunning the same command resumes"
    return Stage(command, r"m2: backfill \(", line, the_rerun_backfills)


def index_stage(tmp: Path, address: str, fixture: Fixture) -> Stage:
    """``raycompat index build``: a sharded build, its tasks on Ray."""
    from tests.cluster.pipelines.test_pipelines import make_source

    store = make_source(tmp / "store", "g", 20_000, 2, 1000)
    command = [sys.executable, "-m", "raycompat.cli.app", "index", "build", "g", "--version",
               "v1", "--store", store.root, "--kind", "sharded_ivf", "--nlist", "64",
               "--runner", "ray", "--address", address]  # fmt: skip

    def the_rerun_builds_it(lines: list[str]) -> None:
        from raycompat.index.version_index import published_pointer

        assert published_pointer(store, "g", "v1") is None, lines  # not built: not published
        rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                               env=user_env(), timeout=300)  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr
        assert published_pointer(store, "g", "v1")["kind"] == "sharded_ivf", rerun.stdout

    line = "raycompat: interrupted; an index is published only once built and measured"
    return Stage(command, r"trained 64 lists", line, the_rerun_builds_it)


def tune_stage(tmp: Path, address: str, fixture: Fixture) -> Stage:
    """A one-trial sweep over a seconds-long synthetic CL2R training."""
    from tests.cluster.tune.test_sweep import toy_cl2r

    config = job_config(
        tmp,
        base=str(REPO / "configs" / "train_mnist_cl2r.yaml"),
        space=[{"key": "method_options.lam", "values": [0.1]}],
        objective="self_test",
        storage_path=str(tmp),
        name="sweep",
    )
    overrides = toy_cl2r(6, 40, "epochs=50", "scenario.tasks=[6]")

    def saves_the_sweep_for_a_rerun(lines: list[str]) -> None:
        from ray import tune

        assert tune.Tuner.can_restore(str(tmp / "sweep"))  # what the same command restores
        assert not (tmp / "sweep" / "results").exists()  # no results of a sweep cut short

    command = [sys.executable, "jobs/tune.py", "--config", config, "--address", address,
               overrides]  # fmt: skip
    line = "tune.py: interrupted; rerunning the same command restores the sweep"
    return Stage(command, r"epoch \d+/50", line, saves_the_sweep_for_a_rerun)


STAGES = {
    "train": train_stage,
    "extract": extract_stage,
    "transform": transform_stage,
    "backfill": backfill_stage,
    "index": index_stage,
    "tune": tune_stage,
}


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("stage", STAGES)
def test_ctrl_c_in_every_stage_is_one_line_and_exit_130(stage, tmp_path, ray_local, request):
    address = ray_local.get_runtime_context().gcs_address
    case = STAGES[stage](tmp_path, address, request.getfixturevalue)
    code, lines = interrupted(case.command, re.compile(case.ready).search, ignored=case.ignored)
    assert code == 130, lines
    assert lines and lines[-1].startswith(case.line), lines
    assert [line for line in lines if ": interrupted; " in line] == lines[-1:], lines
    assert not [line for line in lines if "Traceback" in line or "KeyboardInterrupt" in line]
    case.check(lines)


# ---- issue 41, item 6: more bad input, one line each ---------------------------------------------


def test_a_yaml_syntax_error_in_a_job_config_is_one_line_naming_file_line_and_column(
    tmp_path, capsys
):
    from raycompat.cli.jobs.upgrade import main as upgrade

    config = tmp_path / "bad.yaml"
    config.write_text("name: x\nstore:\n  root: [a\n")
    with pytest.raises(SystemExit) as exit_:
        run_main(upgrade, ["--config", str(config)])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        f"error: {config}: line 4, column 1: YAML syntax error: expected ',' or ']', but got "
        "'<stream end>' (while parsing a flow sequence started at line 3, column 9)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # nothing written


def test_a_store_that_is_a_file_is_named_a_file(tmp_path, capsys):
    (tmp_path / "store").write_text("not a store")
    code, out, err = cli(capsys, "versions", "faces", "--store", str(tmp_path / "store"))
    assert (code, out) == (2, "")
    assert err == [
        f"raycompat: error: no store at {tmp_path / 'store'}: it is a file, not a folder"
    ]
    assert (tmp_path / "store").read_text() == "not a store"


@pytest.mark.parametrize("command", [["history", "faces"], ["status"], ["versions", "faces"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(store, command):
    """``raycompat history ... | head -1``: stdout is a pipe whose reader has gone (EPIPE at
    the first write); exit 141 (128 + SIGPIPE) as ``git log | head`` does, no traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes its first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "raycompat.cli.app", *command, "--store", store.uri()],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_a_full_disk_anywhere_is_named_not_blamed_on_the_store_options(store, capsys, monkeypatch):
    from raycompat.cli import app

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", store.path("faces", "x.parquet"))

    monkeypatch.setitem(app.COMMANDS, "versions", full)
    code, out, err = cli(capsys, "versions", "faces", "--store", store.uri())
    assert (code, out) == (1, "")
    where = store.path("faces", "x.parquet")
    assert err == [f"raycompat: error: no space left on device writing {where}"]
