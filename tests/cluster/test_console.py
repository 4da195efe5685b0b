"""Quiet logs: stage announcements, one line per epoch, no harmless Ray, Ray Data or faiss
noise, everything back with ``--verbose``.

Unit tests on the pieces (the filter of Ray's forwarded lines, the libraries' log levels, Ray
Data's context, the workers' setup hook, the epoch line), and two real jobs in subprocesses,
joined to the session's Ray, whose whole console output is read: the demo's upgrade history at
toy size (``jobs/upgrade.py``, quiet) and ``jobs/train.py`` with ``--verbose``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raycompat.cluster import console as ray_console
from raycompat.cluster.console import (
    PRINT_HANDLER,
    SETUP_HOOK,
    VERBOSE_ENV,
    filtered,
    install_console_filter,
    is_harmless,
    worker_env,
)
from raycompat.cluster.train.epoch_log import EpochClock, epoch_line, images_per_s
from raycompat.progress import CONSOLE_ENV, TERMINAL

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


def test_the_gcs_failing_to_kill_an_actor_already_gone_is_harmless():
    gone = (
        "[2026-12-01 21:50:17,210 E 10597 10597] gcs_actor_scheduler.cc:620: Failed to kill "
        "actor 4896ce58e447217356e98e2601000000, return status: RpcError: RPC error: Cancelling "
        "all calls rpc_code: 14"
    )
    assert is_harmless(gone)
    assert not is_harmless(gone.replace("RpcError: RPC error", "IOError: disk full"))


RAYLET_WORKERS = (
    "WARNING: 22 PYTHON worker processes have been started on node: 5f0c8a2e9b1d with address: "
    "10.0.0.7, which is 11x the maximum expected startup concurrency (2). This could be a result "
    "of using a large number of actors, tasks blocked in ray.get() calls, or tasks with "
    "fractional CPU requests (e.g., num_cpus=0.1) allowing high concurrency. See "
    "https://github.com/ray-project/ray/issues/3644 for some discussion of workarounds."
)


def test_the_raylets_count_of_a_sweeps_workers_is_harmless():
    assert is_harmless(RAYLET_WORKERS)
    assert not is_harmless("WARNING: the node 5f0c8a2e9b1d is running low on memory")


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


def test_install_filters_the_warnings_rays_error_thread_prints(dispatcher, monkeypatch, capsys):
    """The raylet's warnings reach the console through ``print_to_stdstream`` called by Ray's
    error thread (``listen_error_messages``), not through the dispatcher's handlers."""
    import inspect

    import ray._private.worker as worker

    monkeypatch.setattr(worker, "print_to_stdstream", worker.print_to_stdstream)  # restored after
    assert "print_to_stdstream(" in inspect.getsource(worker.listen_error_messages)
    install_console_filter()
    install_console_filter()
    assert not hasattr(worker.print_to_stdstream.unfiltered, "unfiltered")  # wrapped once
    for line in (RAYLET_WORKERS, "WARNING: the node is running low on memory"):
        worker.print_to_stdstream({"lines": [line], "pid": "raylet", "is_err": False}, False)
    printed = capsys.readouterr().out
    assert "PYTHON worker processes" not in printed
    assert "running low on memory" in printed


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


def test_verbose_and_the_setup_hook_reach_the_workers_through_the_runtime_env(monkeypatch):
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    hook = {"worker_process_setup_hook": SETUP_HOOK}
    assert worker_env(False) == hook
    assert worker_env(True) == {**hook, "env_vars": {VERBOSE_ENV: "1"}}
    # a driver on a terminal: its workers send their progress bars for it to draw
    bars = {CONSOLE_ENV: TERMINAL, ray_console.TRAIN_PRINT_PATCH_ENV: "0"}
    assert worker_env(False, terminal=True) == {**hook, "env_vars": bars}
    submitted = {"runtime_env": {"env_vars": {VERBOSE_ENV: "1"}, "working_dir": "x"}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(submitted))
    assert worker_env(True) == hook  # `ray job submit` set it: a second value would conflict
    submitted["runtime_env"]["worker_process_setup_hook"] = "theirs.setup"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(submitted))
    assert worker_env(True) is None  # theirs stands: Ray refuses two hooks


def test_init_ray_starts_a_private_local_ray_without_the_dashboard(monkeypatch):
    """Every job's private local Ray runs without Ray's dashboard (its start-up was the largest
    fixed cost of a small job: docs/scale.md, issue 53)."""
    import ray

    from raycompat.cluster import which_ray

    started = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **options: started.append(options))
    monkeypatch.setattr(which_ray, "announce", lambda address: None)
    monkeypatch.setattr(ray_console, "on_terminal", lambda: False, raising=False)
    for name in ("set_log_level", "quiet_ray_data", "plain_prefixes", "install_console_filter"):
        monkeypatch.setattr(ray_console, name, lambda *args: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray_console.init_ray(None)
    assert len(started) == 1 and started[0]["include_dashboard"] is False


@pytest.mark.parametrize(
    "address, env, expected",
    [
        (None, None, "local"),  # a private Ray: ray.init() would join the latest on the machine
        (None, "http://127.0.0.1:8265", "http://127.0.0.1:8265"),  # what ray job submit sets
        ("auto", "http://127.0.0.1:8265", "auto"),  # --address wins
    ],
)
def test_init_ray_follows_the_rule_and_names_its_ray_instead_of_rays_lines(
    monkeypatch, address, env, expected
):
    """A job's Ray (issue 52, items 4 and 7): ``jobs/upgrade.py`` and ``jobs/transform.py``
    called ``ray.init()`` and joined the newest cluster found; they start or join what
    which_ray's rule gives, at Ray's WARNING level (its "Started a local Ray instance" and
    "Connecting to existing Ray cluster" lines are INFO), and log the one line naming it."""
    import ray

    from raycompat.cluster import which_ray

    started, announced = [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **options: started.append(options))
    monkeypatch.setattr(which_ray, "announce", announced.append)
    monkeypatch.setattr(ray_console, "on_terminal", lambda: False, raising=False)
    for name in ("set_log_level", "quiet_ray_data", "plain_prefixes", "install_console_filter"):
        monkeypatch.setattr(ray_console, name, lambda *args: None)
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    ray_console.init_ray(address)
    (options,) = started
    assert options["address"] == expected and options["logging_level"] == logging.WARNING
    assert announced == [expected]


def test_log_level_follows_verbose(monkeypatch):
    import logging

    ours = logging.getLogger("raycompat")
    monkeypatch.setattr(ours, "level", ours.level)  # restored after the test
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    libraries = [logging.getLogger(n) for n in ("faiss.loader", "ray.tune", "ray.train")]
    progress = logging.getLogger("ray.data._internal.progress")
    from ray.train.v2._internal.execution.controller import placement_group_cleaner

    cleaner = logging.getLogger(placement_group_cleaner.__name__)
    for logger in [*libraries, progress, cleaner]:
        monkeypatch.setattr(logger, "level", logger.level)
    ray_console.set_log_level(False)
    assert logging.getLogger("raycompat.io.weights").getEffectiveLevel() == logging.INFO
    # faiss' "Loading faiss with AVX2 support.", Tune's and Train's INFO; Ray Data's warning
    # that its progress bars are off
    assert [logger.level for logger in libraries] == [logging.WARNING] * 3
    assert progress.level == logging.ERROR
    assert placement_group_cleaner.logger is cleaner and cleaner.level == logging.ERROR
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
    assert [logger.level for logger in libraries] == [logging.INFO] * 3


def test_ray_data_is_quieted_through_its_context_and_console_handler(monkeypatch, caplog):
    """Only Ray Data's own console handler changes level: its session file stays complete, and
    the handlers others put on the non-propagating ``ray.data`` logger (pytest's capture
    handlers, a user's own) keep theirs. Changing every ``StreamHandler`` there once silenced
    caplog for the rest of the session (pytest attaches its handler to such loggers)."""
    from ray.data import DataContext

    context = DataContext.get_current()
    fields = ("enable_progress_bars", "print_on_execution_start", "verbose_stats_logs")
    for name in fields:
        monkeypatch.setattr(context, name, getattr(context, name))
    ray_data = logging.getLogger("ray.data")
    theirs = logging.StreamHandler(sys.stderr)  # a user's own handler on Ray Data's logger
    theirs.setLevel(logging.DEBUG)
    monkeypatch.setattr(ray_data, "handlers", list(ray_data.handlers))  # both removed after
    ray_data.addHandler(theirs)
    if caplog.handler not in ray_data.handlers:  # pytest attaches it where ray.data existed
        ray_data.addHandler(caplog.handler)  # before the test (any longer session)
    caplog.set_level(logging.INFO)
    for handler in ray_data.handlers:
        monkeypatch.setattr(handler, "level", handler.level)
    console = ray_console.ray_data_console_handlers()
    others = [(h, h.level) for h in ray_data.handlers if h not in console]
    assert len(console) == 1 and any(h is theirs for h, _ in others)
    assert any(not isinstance(h, logging.StreamHandler) for h, _ in others)  # ray-data.log
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)  # a log file, CI, `ray job logs`
    ray_console.quiet_ray_data(False)
    assert [getattr(context, name) for name in fields] == [False, False, False]
    assert {h.level for h in console} == {logging.WARNING}
    assert [(h, h.level) for h, _ in others] == others
    logging.getLogger("raycompat.jobs.transform").info("still captured")
    assert "still captured" in caplog.text
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    ray_console.quiet_ray_data(False)
    assert context.enable_progress_bars and not context.print_on_execution_start  # a terminal
    ray_console.quiet_ray_data(True)
    assert [getattr(context, name) for name in fields] == [True, True, True]
    assert {h.level for h in console} == {logging.INFO}
    assert [(h, h.level) for h, _ in others] == others


@pytest.mark.ray
def test_the_setup_hook_gives_a_worker_its_cluster_address_and_quiet_levels(ray_local):
    """What Ray Train's PlacementGroupCleaner needs to find its cluster with another Ray on
    the host. Run in a worker of its own (a runtime env no other test uses), which keeps what
    the hook sets."""

    @ray_local.remote(runtime_env={"env_vars": {"RAYCOMPAT_TEST_WORKER": "setup-hook"}})
    def worker_view() -> tuple:
        before = os.environ.get("RAY_ADDRESS")
        ray_console.configure_worker()
        return before, os.environ.get("RAY_ADDRESS"), logging.getLogger("faiss.loader").level

    address = ray_local.get_runtime_context().gcs_address
    assert ray_local.get(worker_view.remote(), timeout=120) == (None, address, logging.WARNING)


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


def test_rays_prefixes_are_plain_unless_both_streams_are_a_terminal(monkeypatch):
    """A log redirected to a file gets no colour codes from Ray's ``(pid=...)`` prefixes."""
    monkeypatch.delenv(ray_console.COLOR_ENV, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    ray_console.plain_prefixes()
    assert ray_console.COLOR_ENV not in os.environ  # a terminal: Ray's colours stay
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    ray_console.plain_prefixes()
    assert os.environ[ray_console.COLOR_ENV] == "0"
    monkeypatch.setenv(ray_console.COLOR_ENV, "1")
    ray_console.plain_prefixes()
    assert os.environ[ray_console.COLOR_ENV] == "1"  # the user's choice stands
    record = logging.LogRecord(
        "ray",
        logging.INFO,
        __file__,
        1,
        "View the dashboard at %s%s%s",
        ("\x1b[1m", "h:1", "\x1b[39m"),
        None,
    )
    assert ray_console.StripColour().filter(record)
    assert record.getMessage() == "View the dashboard at h:1"


# ---- real job runs ------------------------------------------------------------------------------

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
EPOCH_LINE = re.compile(
    r"(\S+)/step_(\d) epoch (\d+)/(\d+): ce=\S+ .*loss=\S+ \| \d+ img/s \| ETA \d+s"
)
# What the console of a quiet job must not hold: Ray Train's INFO, Ray Data's plan, progress
# block and warnings, faiss' loader, Ray core's ERROR about restartable actors, Ray Train's
# PlacementGroupCleaner failing to find its cluster, and any traceback.
NOISE = (
    "TrainingReport(",
    "Checkpoint successfully created",
    "Started training worker group",
    "PlacementGroupCleaner",
    "Found multiple active Ray instances",
    "Starting execution of Dataset",
    "Execution plan of Dataset",
    "Running Dataset",
    "Total Progress:",
    "Active & requested resources",
    "Progress will be logged",
    "Progress bars disabled",
    "execution finished in",
    "faiss with",  # faiss.loader: "Loading faiss with AVX2 support." ...
    "core_worker.cc",
    "has constructor arguments in the object store",
    "will not allow it to scale up",
    "Traceback (most recent call last)",
)
# Our lines: our loggers' on the driver, and a training run's forwarded by Ray from its worker
# with the "(name pid=N)" prefix (the setup hook logs them by run and step, no timestamp)
OURS = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} raycompat[\w.]*: "
    r"|\(\w+ pid=\d+(, ip=[\d.]+)?\) "  # a line a training run's worker logs, forwarded by Ray
    r"([\w.-]+-m\d-[0-9a-f]{8}(-\w+)?|[0-9a-f]{5}_\d{5})"  # a job's run, or a sweep's trial
    r"/(step_\d+|transformation)[: ]"
)
# The demo's upgrade history (configs/upgrade_mnist.yaml: m1 alone, m2 d-Simplex-HOC against
# it) at toy size: 20 MNIST-5k images per digit, one epoch, a gallery of two parts.
TOY_UPGRADE = {
    "name": "toy",
    "store": {"gallery": "mnist"},
    "gallery_images": {"kind": "dataset", "name": "mnist5k", "options": {"per_class": 20}},
    "normalized": True,
    "training": {
        "model": {"backbone": "lenetpp", "head": "dsimplex", "num_classes": 10},
        "data": {"name": "mnist5k", "options": {"per_class": 20}},
        "eval": {"protocol": "identification", "split": "open_set", "test_classes": [7, 8, 9]},
        "optim": {"name": "adam", "lr": 0.002, "weight_decay": 0.0, "schedule": "constant"},
        "scaling": {"num_workers": 1, "cpus_per_worker": 1.0},  # train.py's run has 2
        "epochs": 1,
        "batch_size": 64,
    },
    "upgrades": [
        {"model_version": "m1", "classes": 5, "method": "independent"},
        {
            "model_version": "m2",
            "classes": 6,
            "method": "dsimplex_hoc",
            "method_options": {"lam": 0.1, "rho": 5.0},
        },
    ],
    "pipeline": {"rows_per_file": 100, "batch_size": 100, "actors": 1},
}
STAGES = [
    "[1/2] m1: training independent on 5 classes (1 epoch)",
    "[1/2] m1: extracting the gallery into v1",
    "[2/2] m2: training dsimplex_hoc against m1 (1 epoch)",
    "[2/2] m2: scoring against m1",
]


def start_job(address: str, script: str, *args: str) -> subprocess.Popen:
    """``jobs/<script>`` joined to the session's Ray, started in the background."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "jobs" / script), "--address", address, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # The console a user sees comes with Ray Train's defaults: conftest turns the
        # preemption watcher off for speed, and its actor is among what prints to the console.
        env={**os.environ, "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"},
    )


def start_upgrade(address: str, tmp_path: Path) -> subprocess.Popen:
    config = {
        **TOY_UPGRADE,
        "store": {**TOY_UPGRADE["store"], "root": str(tmp_path / "store")},
        "report_dir": str(tmp_path / "report"),
        "work_dir": str(tmp_path / "work"),
    }
    config["training"] = {**config["training"], "run": {"storage_path": str(tmp_path / "runs")}}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "toy_upgrade.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return start_job(address, "upgrade.py", "--config", str(path))


def start_train(address: str, storage: Path, *args: str) -> subprocess.Popen:
    return start_job(
        address, "train.py", *TOY, "run.name=toy", f"run.storage_path={storage}", *args
    )


def job_output(job: subprocess.Popen, name: str) -> str:
    """The job's stdout and stderr together, once it has ended (successfully)."""
    try:
        out, _ = job.communicate(timeout=500)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
        raise AssertionError(f"{name} still running after 500 s:\n{out[-5000:]}") from None
    assert job.returncode == 0, out[-5000:]
    return out


@pytest.mark.ray
@pytest.mark.slow
def test_the_upgrade_console_announces_its_stages_and_holds_no_noise_and_verbose_restores_it(
    ray_local, tmp_path
):
    address = ray_local.get_runtime_context().gcs_address
    # Both jobs at once (1 and 2 training workers, 1 pipeline actor: the session's 4 CPUs hold
    # both); Ray sends each driver only its own job's lines, so neither sees the other's.
    quiet = start_upgrade(address, tmp_path / "upgrade")
    try:
        verbose_job = start_train(address, tmp_path / "verbose", "epochs=1", "--verbose")
    except BaseException:
        quiet.kill()
        raise
    try:
        out = job_output(quiet, "jobs/upgrade.py")
        verbose = job_output(verbose_job, "jobs/train.py --verbose")
    finally:
        for job in (quiet, verbose_job):
            if job.poll() is None:  # the other one failed: stop this one too
                job.kill()
                job.communicate()
    for noise in NOISE:
        assert noise not in out, f"{noise!r} in the quiet console:\n{out}"
    # Only our lines: each is one of our loggers' (on the driver, or a worker's forwarded by
    # Ray with its "(name pid=N)" prefix), whatever Ray or a library might add
    foreign = [line for line in out.splitlines() if line.strip() and not OURS.match(line)]
    assert not foreign, f"lines not ours in the quiet console: {foreign}\n{out}"
    assert "\x1b[" not in out + verbose, "colour codes in a log that is not a terminal"
    assert "row of the compatibility matrix" not in out, out  # one line per stage
    (summary,) = [line for line in out.splitlines() if "raycompat.jobs.upgrade: summary: " in line]
    assert len(summary) < 300 and "decisions={m1: initial, m2: refuse}" in summary, summary
    announced = [
        line.split("raycompat.progress: ", 1)[1]
        for line in out.splitlines()
        if "raycompat.progress: " in line
    ]
    # In order, each before its work (ETA from the second model on, once m1 has finished)
    assert [line.split(" | ETA ")[0] for line in announced] == STAGES, out
    assert " | ETA " in announced[2] and " | ETA " not in announced[0]
    assert out.index(STAGES[1]) < out.index("extract mnist/v1: 200 / 200 rows"), out
    epochs = [m.groups() for m in EPOCH_LINE.finditer(out)]
    assert [(e[0].split("-")[1], e[1:]) for e in epochs] == [
        ("m1", ("1", "1", "1")),
        ("m2", ("2", "1", "1")),
    ], out  # once per epoch
    (m1_metrics,) = (tmp_path / "upgrade/runs").glob("toy-m1-*/metrics.jsonl")
    records = [json.loads(line) for line in m1_metrics.open()]  # rank 0's report, once
    assert [(r["step"], r["epoch"]) for r in records] == [("step_1", 0)]
    assert records[0]["images_per_s"] > 0 and "ce" in records[0]

    assert "TrainingReport(" in verbose and "Checkpoint successfully created" in verbose
    # Unfiltered, Ray Train's own restartable actors' line is there: the quiet run's filter did
    # drop it. (If Ray no longer prints it, drop its entry from HARMLESS_RAY_LINES.)
    assert "has constructor arguments in the object store" in verbose, verbose
    # 2 workers, rank 0 only
    assert [m.groups()[1:] for m in EPOCH_LINE.finditer(verbose)] == [("1", "1", "1")], verbose
