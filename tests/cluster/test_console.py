"""Quiet logs: one line per epoch, no harmless Ray noise, everything back with ``--verbose``.

Unit tests on the pieces (the filter of Ray's forwarded lines, the epoch line), and a real job
run (``jobs/train.py`` in a subprocess, joined to the session's Ray) whose whole console output
is read, quiet and verbose.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raycompat.cluster import console as ray_console
from raycompat.cluster.console import (
    PRINT_HANDLER,
    VERBOSE_ENV,
    filtered,
    install_console_filter,
    is_harmless,
    worker_env,
)
from raycompat.cluster.train.epoch_log import EpochClock, epoch_line, images_per_s

ROOT = Path(__file__).resolve().parents[2]
HARMLESS = (
    "[2026-11-23 13:08:28,495 E 15427 15557] core_worker.cc:2330: Actor with class name: "
    "'{name}' and ID: '7f6fdb8be3e616bc723e045d01000000' has constructor arguments in the object "
    "store and max_restarts > 0. If the arguments in the object store go out of scope or are "
    "lost, the actor restart will fail. See https://github.com/ray-project/ray/issues/53727 for "
    "more details."
)


def batch(*lines: str, is_err: bool = True) -> dict:
    """A batch of forwarded lines as Ray's log monitor publishes it (log_monitor.py)."""
    return {
        "ip": "192.0.2.2",
        "pid": 15427,
        "job": "01000000",
        "is_err": is_err,
        "lines": list(lines),
        "actor_name": "TrainController",
        "task_name": None,
        "localhost": "192.0.2.2",
    }


# ---- the filter of Ray's forwarded lines ------------------------------------------------------


def test_filter_drops_the_harmless_line_and_keeps_the_others():
    printed = []
    handler = filtered(printed.append)
    real_error = "[2026-11-23 13:08:28,495 E 15427 15557] core_worker.cc:1: Actor creation failed"
    handler(batch(HARMLESS.format(name="PreemptionWatcher"), real_error, "step_1 epoch 1/2: ..."))
    handler(batch(HARMLESS.format(name="_AutoscalingCoordinatorActor")))  # nothing left to print
    untouched = batch("Traceback (most recent call last):", is_err=False)
    handler(untouched)
    assert [b["lines"] for b in printed] == [
        [real_error, "step_1 epoch 1/2: ..."],
        ["Traceback (most recent call last):"],
    ]
    assert {k: v for k, v in printed[0].items() if k != "lines"} == {
        k: v for k, v in batch().items() if k != "lines"
    }
    assert printed[1] is untouched  # a batch without a harmless line is passed on as it is


@pytest.mark.parametrize(
    "line",
    [
        "has constructor arguments in the object store",  # not Ray's core-worker line
        "core_worker.cc:12: Actor with class name: 'A' and ID: 'ff' died unexpectedly",
        "RuntimeError: injected failure at step 0 epoch 0 batch 1",
    ],
)
def test_only_registered_lines_are_harmless(line):
    assert not is_harmless(line)
    assert is_harmless(HARMLESS.format(name="PreemptionWatcher"))


@pytest.fixture
def dispatcher(monkeypatch):
    """Ray's real dispatcher of forwarded lines, with its handler list swapped for the test."""
    from ray._private.worker import global_worker_stdstream_dispatcher

    monkeypatch.setattr(global_worker_stdstream_dispatcher, "handlers", [])
    return global_worker_stdstream_dispatcher


def test_install_wraps_rays_printer_once(dispatcher):
    printed = []
    dispatcher.add_handler(PRINT_HANDLER, printed.append)
    dispatcher.add_handler("other", lambda data: printed.append(("other", data["lines"])))
    assert install_console_filter() and install_console_filter()
    dispatcher.emit(batch(HARMLESS.format(name="PreemptionWatcher"), "kept"))
    assert printed[0]["lines"] == ["kept"]
    assert printed[1] == ("other", [HARMLESS.format(name="PreemptionWatcher"), "kept"])
    assert dispatcher.handlers[0][1].unfiltered == printed.append  # wrapped once, not twice


def test_install_does_nothing_without_rays_printer(dispatcher, monkeypatch):
    assert not install_console_filter()  # Ray started without log_to_driver
    import ray._private.worker

    monkeypatch.delattr(ray._private.worker, "global_worker_stdstream_dispatcher")
    assert not install_console_filter()  # a Ray that moved it: no crash, no filter


def test_ray_registers_its_printer_where_the_filter_looks():
    """The private API the filter wraps (Ray 2.58): a Ray upgrade that moves it fails here."""
    import inspect

    import ray._private.worker as worker

    dispatcher = worker.global_worker_stdstream_dispatcher
    assert isinstance(dispatcher.handlers, list) and hasattr(dispatcher, "_lock")
    assert f'"{PRINT_HANDLER}"' in inspect.getsource(worker.connect)
    assert "global_worker_stdstream_dispatcher.emit(data)" in inspect.getsource(worker.Worker)


def test_verbose_reaches_the_workers_through_the_runtime_env(monkeypatch):
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert worker_env(False) is None
    assert worker_env(True) == {"env_vars": {VERBOSE_ENV: "1"}}
    submitted = {"runtime_env": {"env_vars": {VERBOSE_ENV: "1"}, "working_dir": "x"}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(submitted))
    assert worker_env(True) is None  # `ray job submit` set it: a second value would conflict


def test_log_level_follows_verbose(monkeypatch):
    import logging

    ours = logging.getLogger("raycompat")
    monkeypatch.setattr(ours, "level", ours.level)  # restored after the test
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    ray_console.set_log_level(False)
    assert logging.getLogger("raycompat.io.weights").getEffectiveLevel() == logging.INFO
    assert ray_console.train_logging_config().log_level == "WARNING"
    # Ray Train's worker context logs its reports under its file name, not ray.train.*
    from ray.train.v2._internal.execution import context

    reports = logging.getLogger(context.__file__)
    monkeypatch.setattr(reports, "level", reports.level)
    ray_console.set_log_level(False)
    assert reports.getEffectiveLevel() == logging.WARNING
    monkeypatch.setenv(VERBOSE_ENV, "1")  # what a Ray worker of a --verbose job sees
    ray_console.set_log_level()
    assert logging.getLogger("raycompat.io.weights").getEffectiveLevel() == logging.DEBUG
    assert ray_console.train_logging_config().log_level == "INFO"
    assert reports.getEffectiveLevel() == logging.INFO


# ---- the epoch line -----------------------------------------------------------------------


def test_epoch_line_format():
    line = epoch_line("toy/step_2", 2, 10, {"loss": 1.28449, "ce": 1.234, "hoc": 0.05}, 812.4, 95.2)
    assert line == "toy/step_2 epoch 3/10: ce=1.234 hoc=0.05 loss=1.284 | 812 img/s | ETA 95s"


def test_eta_is_the_mean_epoch_time_times_the_epochs_left():
    clock = EpochClock(first=2, epochs=10)  # resumed after epoch 1
    clock.start -= 30.0  # epochs 2, 3 and 4 took 30 s
    assert clock.eta_s(4) == pytest.approx(10.0 * 5, rel=0.01)
    assert clock.eta_s(9) == 0.0
    assert images_per_s(640, 0.5) == 1280.0 and images_per_s(0, 0.0) == 0.0


def test_metrics_log_appends_rank_0s_report_to_the_run_directory(tmp_path):
    import pyarrow.fs as pafs

    from raycompat.cluster.train.epoch_log import MetricsLog

    path = f"{tmp_path}/run/metrics.jsonl"
    callback = MetricsLog(pafs.LocalFileSystem(), path, "step_1")
    for epoch in range(2):  # metrics[i] is what rank i reported
        callback.after_report(
            None, [{"epoch": epoch, "ce": 1.5}, {"epoch": epoch, "ce": 9.0}], None
        )
    lines = Path(path).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": "step_1", "epoch": 0, "ce": 1.5},
        {"step": "step_1", "epoch": 1, "ce": 1.5},
    ]


# ---- a real job run ----------------------------------------------------------------------------

TOY = [
    "data.name=synthetic",
    "data.options={num_classes: 6, images_per_class: 20, image_size: 28, channels: 1, seed: 3}",
    "model.num_classes=6",
    "method=cores",
    "scenario.tasks=[6]",
    "optim.name=adam",
    "optim.lr=0.003",
    "optim.weight_decay=0.0",
    "optim.schedule=constant",
    "eval.batch_size=128",
    "batch_size=32",
    "scaling.num_workers=2",
]
EPOCH_LINE = re.compile(r"toy/step_1 epoch (\d+)/(\d+): ce=\S+ loss=\S+ \| \d+ img/s \| ETA \d+s")
NOISE = ("TrainingReport(", "Checkpoint successfully created", "Started training worker group")


def start_job(address: str, storage: Path, *args: str) -> subprocess.Popen:
    """``jobs/train.py`` joined to the session's Ray, started in the background."""
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "jobs" / "train.py"),
            "--address",
            address,
            *TOY,
            "run.name=toy",
            f"run.storage_path={storage}",
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # The console a user sees comes with Ray Train's defaults: conftest turns the
        # preemption watcher off for speed, and its actor is among what prints to the console.
        env={**os.environ, "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"},
    )


def job_output(job: subprocess.Popen) -> str:
    """The job's stdout and stderr together, once it has ended (successfully)."""
    try:
        out, _ = job.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
        raise AssertionError(f"jobs/train.py still running after 400 s:\n{out[-5000:]}") from None
    assert job.returncode == 0, out[-5000:]
    return out


@pytest.mark.ray
@pytest.mark.slow
def test_a_job_prints_one_line_per_epoch_and_verbose_restores_ray_trains_lines(ray_local, tmp_path):
    address = ray_local.get_runtime_context().gcs_address
    # Both jobs at once (2 training workers each: the session's 4 CPUs hold both); Ray sends
    # each driver only its own job's lines, so neither sees the other's.
    quiet = start_job(address, tmp_path / "quiet", "epochs=2")
    try:
        verbose_job = start_job(address, tmp_path / "verbose", "epochs=1", "--verbose")
    except BaseException:
        quiet.kill()
        raise
    try:
        out = job_output(quiet)
        verbose = job_output(verbose_job)
    finally:
        for job in (quiet, verbose_job):
            if job.poll() is None:  # the other one failed: stop this one too
                job.kill()
                job.communicate()
    for noise in (*NOISE, "has constructor arguments in the object store"):
        assert noise not in out, out
    epochs = [m.groups() for m in EPOCH_LINE.finditer(out)]
    assert epochs == [("1", "2"), ("2", "2")], out  # rank 0 only, once per epoch
    records = [json.loads(line) for line in (tmp_path / "quiet/toy/metrics.jsonl").open()]
    assert [(r["step"], r["epoch"]) for r in records] == [("step_1", 0), ("step_1", 1)]
    assert records[0]["images_per_s"] > 0 and "ce" in records[0]

    assert "TrainingReport(" in verbose and "Checkpoint successfully created" in verbose
    # Unfiltered, the harmless line is there: the quiet run's filter did drop it. (If Ray no
    # longer prints it, drop its entry from HARMLESS_RAY_LINES.)
    assert "has constructor arguments in the object store" in verbose, verbose
    assert [m.groups() for m in EPOCH_LINE.finditer(verbose)] == [("1", "1")], verbose
