"""``raycompat-deploy`` (``jobs/deploy.py``) before Ray starts: a bad config or a store that is
not there is one line and exit 2, ``--dry-run`` checks the store and deploys nothing. The
deploy itself runs against a real head in tests/cluster/test_service.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from raycompat.store import GalleryStore
from tests.serving.test_served_log import served_store

SCRIPT = Path(sys.executable).with_name("raycompat-deploy")


def deploy(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, *argv], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "raycompat-deploy: error: store.root must be set: the store the service searches"),
        (("store.root=nope",), "store.root {tmp}/nope: no store there, nothing to serve"),
        (("store.root=store", "service.token_file=gone"),
         "service.token_file gone: unreadable (No such file or directory)"),
        (("store.root=store", "deployment.num_replicas=0"), "deployment.num_replicas must be"),
    ],
)  # fmt: skip
def test_a_bad_config_or_a_missing_store_is_one_line_and_exit_2(argv, message, tmp_path):
    served_store(GalleryStore(str(tmp_path / "store")))
    done = deploy(*argv, cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if "no --config given" not in line]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and message.format(tmp=tmp_path) in lines[0], done.stderr


def test_a_dry_run_checks_the_store_and_deploys_nothing(tmp_path):
    served_store(GalleryStore(str(tmp_path / "store")))
    done = deploy("store.root=store", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "dry run: the config is valid; nothing was run or written",
        f"  input  store.root={tmp_path}/store",
    ]


def test_the_stop_command_it_prints_is_one_the_serve_cli_of_this_ray_has():
    """The deploy's summary tells an operator how to stop serving: that line must be a command
    of the pinned Ray's ``serve`` CLI (``serve delete``, printed once, is not one)."""
    from ray import serve

    from raycompat.cli.jobs.deploy import STOP_COMMAND

    program, subcommand, *options = STOP_COMMAND.split()
    helped = subprocess.run(
        [Path(sys.executable).with_name(program), subcommand, "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert helped.returncode == 0, helped.stderr
    assert all(option in helped.stdout for option in options), helped.stdout
    assert callable(serve.delete)  # the Python form the same line names
