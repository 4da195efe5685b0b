"""A one-worker run as one Ray task (``raycompat.cluster.train.task_run``): which runs take it,
which checkpoints it keeps and records, and its retries, resumes and non-finite stop with a real
Ray task. The model steps and FCT runs of one worker that go through it end to end are the
upgrade job's (tests/cluster/upgrade) and the non-finite step's (test_train_ray.py)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import torch

from raycompat.cluster.train import session
from raycompat.cluster.train.task_run import (
    Keep,
    TaskSession,
    fit_in_task,
    follows_tasks,
    read_record,
    runs_in_task,
)
from raycompat.config import load_config
from raycompat.config.train import ScalingSpec, TrainConfig
from raycompat.engine import NonFiniteError

LOCAL = pafs.LocalFileSystem()


class Following:
    """A callback that follows a task run: records every report it is handed."""

    def __init__(self) -> None:
        self.reports: list[dict] = []

    def task_report(self, metrics: dict) -> None:
        self.reports.append(metrics)


@pytest.mark.parametrize(
    "changes, datasets, callbacks, expected",
    [
        ({"num_workers": 1}, None, None, True),
        ({"num_workers": 2}, None, None, False),
        ({"num_workers": 1, "strategy": "fsdp"}, None, None, False),
        ({"num_workers": 1, "one_worker_runner": "ray_train"}, None, None, False),
        ({"num_workers": 1}, {"train": object()}, None, False),  # Ray Data shards
        ({"num_workers": 1}, None, [object()], False),  # a Ray Train callback only
        ({"num_workers": 1}, None, [Following(), object()], False),
        ({"num_workers": 1}, None, [Following()], True),  # e.g. a sweep's callbacks
        ({"num_workers": 2}, None, [Following()], False),
    ],
)
def test_only_a_plain_one_worker_run_without_shards_or_unfollowing_callbacks_runs_in_a_task(
    changes, datasets, callbacks, expected
):
    assert runs_in_task(ScalingSpec(**changes), datasets, callbacks) is expected


def test_the_sweeps_callbacks_follow_task_runs():
    from raycompat.cluster.tune.reaper import PlacementGroupReaper
    from raycompat.cluster.tune.sweep import ObjectiveReportCallback

    assert follows_tasks(PlacementGroupReaper()) and hasattr(ObjectiveReportCallback, "task_report")


def entry(epoch: int, score: float) -> dict:
    return {"dir": f"checkpoint_epoch{epoch:04d}", "metrics": {"epoch": epoch, "s": score}}


def test_kept_checkpoints_are_the_best_by_score_and_always_the_latest():
    entries = [entry(0, 0.5), entry(1, 0.9), entry(2, 0.1), entry(3, 0.2)]
    assert Keep(1, "s").kept(entries) == [entries[1], entries[3]]
    assert Keep(2, "s").kept(entries) == [entries[0], entries[1], entries[3]]
    assert Keep(2).kept(entries) == entries[2:]  # no score: the latest two
    assert Keep(5, "s").kept(entries) == entries


def report_epoch(run: TaskSession, epoch: int, score: float) -> None:
    directory = tempfile.mkdtemp()
    Path(directory, "weights.bin").write_bytes(bytes([epoch]))
    run.report({"epoch": epoch, "s": score}, directory)


def test_reports_are_recorded_logged_and_pruned_to_the_kept_checkpoints(tmp_path):
    run = TaskSession(LOCAL, str(tmp_path), "step_1", Keep(1, "s"), torch.device("cpu"))
    assert run.checkpoint() is None and run.rank_world() == (0, 1)
    for epoch, score in enumerate([0.5, 0.9, 0.1]):
        report_epoch(run, epoch, score)
    folders = sorted(p.name for p in (tmp_path / "step_1").glob("checkpoint_*"))
    assert folders == ["checkpoint_epoch0001", "checkpoint_epoch0002"]  # best, latest
    assert [e["dir"] for e in read_record(LOCAL, str(tmp_path / "step_1"))] == folders
    latest = run.checkpoint()
    with latest.as_directory() as directory:
        assert Path(directory, "weights.bin").read_bytes() == bytes([2])
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": "step_1", "epoch": e, "s": s} for e, s in enumerate([0.5, 0.9, 0.1])]


def test_an_epoch_reported_again_replaces_its_unrecorded_copy(tmp_path):
    """A retry that reaches an epoch whose copy was interrupted (not in the record) writes it
    again whole; a stray file of the old copy does not survive."""
    run = TaskSession(LOCAL, str(tmp_path), "h", Keep(3), torch.device("cpu"))
    stray = tmp_path / "h" / "checkpoint_epoch0000" / "partial.bin"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"half")
    report_epoch(run, 0, 0.0)
    assert not stray.exists()
    assert [e["dir"] for e in run.entries()] == ["checkpoint_epoch0000"]


# ---- real Ray tasks -------------------------------------------------------------------------


def counting_loop(config: dict) -> None:
    """Resumes after the session's checkpoint, reports ``epochs`` epochs. At epoch 1, ``fail``
    ``once`` raises once (a marker file survives the retry), ``exit`` kills the process once,
    ``always`` raises every time, ``nan`` raises a non-finite error."""
    run = session.current()
    first = 0
    checkpoint = run.checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            first = json.loads(Path(directory, "state.json").read_text())["epoch"] + 1
    attempts = Path(config["root"], "attempts")
    attempts.mkdir(exist_ok=True)
    (attempts / f"{os.getpid()}-{len(list(attempts.iterdir()))}").touch()
    for epoch in range(first, config["epochs"]):
        if epoch == 1 and config["fail"] == "nan":
            raise NonFiniteError("h: non-finite loss term 'h_mse' (nan) at epoch 1")
        marker = Path(config["root"], "failed_once")
        once = config["fail"] in ("once", "exit") and not marker.exists()
        if epoch == 1 and (once or config["fail"] == "always"):
            marker.touch()
            if config["fail"] == "exit":
                os._exit(1)  # the process dies, as under the OOM killer
            raise RuntimeError(f"injected failure at epoch {epoch}")
        directory = tempfile.mkdtemp()
        Path(directory, "state.json").write_text(json.dumps({"epoch": epoch}))
        run.report({"epoch": epoch, "device": str(run.device())}, directory)


def fit(tmp_path, fail: str, max_failures: int = 1, epochs: int = 3, callbacks=()):
    cfg = load_config(
        TrainConfig, None, ["scaling.num_workers=1", f"run.max_failures={max_failures}"]
    )
    config = {"root": str(tmp_path), "epochs": epochs, "fail": fail}
    return fit_in_task(counting_loop, config, cfg, LOCAL, str(tmp_path), "h", Keep(2), callbacks)


def attempts(tmp_path) -> int:
    return len(list((tmp_path / "attempts").iterdir()))


@pytest.mark.ray
@pytest.mark.parametrize("fail", ["once", "exit"], ids=["raised", "process_died"])
def test_a_failed_task_is_retried_from_its_latest_checkpoint(ray_local, tmp_path, fail):
    following = Following()
    result = fit(tmp_path, fail, callbacks=[following])
    # each report reached the driver once, in order, the retry's after the first attempt's
    assert following.reports == [{"epoch": e, "device": "cpu"} for e in (0, 1, 2)]
    assert attempts(tmp_path) == 2
    assert result.metrics == {"epoch": 2, "device": "cpu"}
    assert [m["epoch"] for _, m in result.best_checkpoints] == [1, 2]
    with result.checkpoint.as_directory() as directory:
        assert json.loads(Path(directory, "state.json").read_text()) == {"epoch": 2}
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [0, 1, 2]  # epoch 0 not trained twice

    again = fit(tmp_path, "none")  # the same run again: resumes after epoch 2, trains nothing
    assert attempts(tmp_path) == 3 and again.metrics == result.metrics
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.ray
def test_failures_past_max_failures_raise_the_workers_error(ray_local, tmp_path):
    with pytest.raises(RuntimeError, match="injected failure at epoch 1"):
        fit(tmp_path, "always", max_failures=1)
    assert attempts(tmp_path) == 2


@pytest.mark.ray
def test_a_non_finite_step_is_never_retried_and_raises_its_message_alone(ray_local, tmp_path):
    with pytest.raises(NonFiniteError) as caught:
        fit(tmp_path, "nan", max_failures=2)
    assert str(caught.value) == "h: non-finite loss term 'h_mse' (nan) at epoch 1"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert attempts(tmp_path) == 1
    assert [e["dir"] for e in read_record(LOCAL, str(tmp_path / "h"))] == ["checkpoint_epoch0000"]


def sleeping_loop(config: dict) -> None:
    Path(config["root"], "started").touch()
    time.sleep(600)


@pytest.mark.ray
def test_a_killed_owner_ends_its_task_and_frees_the_cpus(ray_local, tmp_path):
    """What a Tune scheduler's stop does to a trial whose step trains in a task: the trial's
    actor (the task's owner) is killed, and the task's CPUs come back."""
    import ray

    cfg = load_config(TrainConfig, None, ["scaling.num_workers=1", "scaling.cpus_per_worker=2"])

    @ray.remote(num_cpus=0)
    class Trial:
        def run(self):
            config = {"root": str(tmp_path)}
            fit_in_task(sleeping_loop, config, cfg, LOCAL, str(tmp_path), "h", Keep(1))

    def free() -> float:
        return ray.available_resources().get("CPU", 0)

    before, deadline = ray.cluster_resources()["CPU"], time.monotonic() + 30
    while free() < before and time.monotonic() < deadline:  # the tests before have ended
        time.sleep(0.2)
    trial = Trial.remote()
    trial.run.remote()
    deadline = time.monotonic() + 60  # the task starts, and Ray's view of the CPUs follows
    while not (tmp_path / "started").exists() or free() > before - 2:
        assert time.monotonic() < deadline, f"the task has not started ({free()} CPUs free)"
        time.sleep(0.1)
    ray.kill(trial)
    deadline = time.monotonic() + 30
    while free() < before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert free() >= before
