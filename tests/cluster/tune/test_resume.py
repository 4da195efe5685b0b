"""An interrupted sweep resumes from its storage path: the driver is killed mid-sweep, and the
same command finishes it without retraining what was already trained."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.cluster.test_console import OURS
from tests.cluster.tune.test_sweep import toy_cl2r

ROOT = Path(__file__).parents[3]


def finished_runs(runs: Path) -> list[Path]:
    """Trial runs whose training finished (``summary.json`` is written last)."""
    return sorted(p.parent for p in runs.glob("*/summary.json"))


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_killed_mid_way_resumes_from_storage_without_retraining(ray_local, tmp_path):
    args = [
        "--config",
        str(ROOT / "configs" / "tune_hoc_lambda.yaml"),
        f"base={ROOT / 'configs' / 'train_mnist_cl2r.yaml'}",
        # One task per trial (one training step, scored on its self-test): resuming is about
        # trials, not the sequence.
        toy_cl2r(6, 40, "optim.lr=0.003", "optim.weight_decay=0.0", "scenario.tasks=[6]"),
        "space=[{key: method_options.lam, values: [0.1, 0.5]}]",
        "objective=self_test",
        "max_concurrent_trials=1",
        f"storage_path={tmp_path}",
        "name=killed",
    ]
    # The sweep's own driver process, joined to this session's Ray as a second job; SIGKILL is
    # a lost head-node shell or a crashed driver: nothing gets the chance to save or clean up.
    address = ray_local.get_runtime_context().gcs_address
    driver = subprocess.Popen(
        [sys.executable, str(ROOT / "jobs" / "tune.py"), "--address", address, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    runs = tmp_path / "killed" / "runs"
    deadline = time.monotonic() + 600
    while not finished_runs(runs) and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert driver.poll() is None, "the sweep ended before it could be interrupted"
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    first = finished_runs(runs)
    assert len(first) == 1 and not (tmp_path / "killed" / "results").exists()
    trained = {r.name: json.loads((r / "state.json").read_text()) for r in first}

    # The same command, run again, as a user runs it: its console is every line it prints
    rerun = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "tune.py"), "--address", address, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr
    console = [line for line in (rerun.stdout + rerun.stderr).splitlines() if line.strip()]
    # Only our lines (issue 52, item 7: a sweep of 4 trials printed 285 lines, Tune's tables
    # among them): our loggers', each trial's one line among them, and none of Tune's
    foreign = [line for line in console if not OURS.match(line)]
    assert not foreign, f"lines not ours on the sweep's console: {foreign}\n{rerun.stderr}"
    trials = re.findall(r"\[(\d)/2\] trial \w+ \(", "\n".join(console))
    assert trials == ["1", "2"] and len(console) <= 20, console  # one line per trial, restored too
    table = pd.read_csv(tmp_path / "killed" / "results" / "trials.csv")
    assert sorted(table["status"]) == ["TERMINATED", "TERMINATED"]
    assert sorted(table["param:method_options.lam"]) == [0.1, 0.5]
    assert table["objective"].notna().all()
    # Restored, not restarted: still one run per trial, under the original trial ids.
    assert len(list(runs.iterdir())) == 2
    assert {Path(p).name for p in table["run_path"]} == {p.name for p in runs.iterdir()}
    # The trial that had finished kept its trained models (same checkpoints, same metrics).
    for name, state in trained.items():
        assert json.loads((runs / name / "state.json").read_text())["steps"] == state["steps"]
