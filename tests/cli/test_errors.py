"""Errors of the ``raycompat`` CLI and the jobs are one line naming what to fix.

Corrupt catalog records are listed beside the readable ones (exit 1), a mistyped store is not an
empty one (exit 2), config mistakes in a job are one line naming the file and the key (exit 2),
and ``--debug`` brings the traceback back.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from raycompat.cli.app import main
from raycompat.cli.errors import run_main
from raycompat.errors import ConfigError, MissingStoreError
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.model_catalog import Catalog, ModelRecord, QueryGrant

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


# ---- Ctrl-C (issue 40, item 7) ------------------------------------------------------------------

SLEEPER = """
import sys, time
from raycompat.cli.errors import run_main

def main(argv):
    print("ready", flush=True)
    time.sleep(60)

run_main(main, resumes="rerunning resumes from the last checkpoint")
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupted(
    command: list[str], ready, timeout: float = 120, ignored: bool = False
) -> tuple[int, list[str]]:
    """Start ``command``, wait until ``ready(line)`` holds for a line of its stderr or stdout,
    send SIGINT: ``(exit status, the stderr lines printed after the signal)``. ``ignored``:
    started with SIGINT ignored, as a shell without job control starts ``command &``."""
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint if ignored else None,
    )
    try:
        stream = proc.stdout if ready.__name__ == "stdout" else proc.stderr
        for line in stream:
            if ready(line):
                break
        else:
            raise AssertionError(f"{command} ended before it was ready: {proc.wait()}")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err.splitlines()


@pytest.mark.parametrize("ignored", [False, True], ids=["foreground", "started_ignoring_sigint"])
def test_ctrl_c_in_a_job_is_one_line_and_exit_130(ignored):
    def stdout(line: str) -> bool:
        return line.strip() == "ready"

    code, lines = interrupted([sys.executable, "-c", SLEEPER], stdout, ignored=ignored)
    assert code == 130, lines
    assert lines == ["-c: interrupted; rerunning resumes from the last checkpoint"], lines


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


@pytest.mark.slow
def test_ctrl_c_during_the_upgrade_jobs_first_training_is_one_line_and_exit_130(tmp_path):
    """Issue 52, item 1: started as a script's ``job &`` starts it (SIGINT ignored), the
    upgrade job went on past a SIGINT in its first training, trained every model and exited
    0. It stops there now, with one line, and a rerun resumes."""

    def stderr(line: str) -> bool:
        return "m1" in line and "epoch 1/" in line

    command = [sys.executable, "jobs/upgrade.py", "--output-root", str(tmp_path),
               "training.epochs=200"]  # fmt: skip
    code, lines = interrupted(command, stderr, ignored=True)
    assert code == 130, lines
    assert lines[-1].startswith("upgrade.py: interrupted; rerunning the same command resumes")
    assert not [line for line in lines if "Traceback" in line or "[2/3]" in line], lines


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
