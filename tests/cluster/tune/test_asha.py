"""ASHA on a small cluster: a stopped trial's Ray Train placement group is given back.

The session's Ray runtime runs without the dashboard, so Ray 2.58's own PlacementGroupCleaner
(which asks the State API whether the controller lives) cannot act: only raycompat's reaper can.
"""

from __future__ import annotations

import asyncio
import faulthandler
import importlib.util
import time
from pathlib import Path

import pandas as pd
import pytest

from raycompat.cluster.tune.sweep import DRIVER_CPUS, trials_that_fit
from raycompat.config.train import ScalingSpec

ROOT = Path(__file__).parents[3]


def test_trials_that_fit_count_each_trials_driver_and_workers():
    assert DRIVER_CPUS == 0.01
    # 1 worker x 1 CPU + 0.01: two such trials need 2.02 CPUs, so 2 CPUs hold one.
    assert trials_that_fit({"CPU": 2.0}, ScalingSpec(num_workers=1)) == 1
    assert trials_that_fit({"CPU": 16.0}, ScalingSpec(num_workers=1)) == 15
    assert trials_that_fit({"CPU": 16.0}, ScalingSpec(num_workers=2, cpus_per_worker=4)) == 1
    assert trials_that_fit({"CPU": 9.0}, ScalingSpec(num_workers=2, cpus_per_worker=4)) == 1
    # GPUs bound it too: 3 GPUs hold one 2-GPU trial however many CPUs there are.
    gpu = ScalingSpec(num_workers=2, use_gpu=True)
    assert trials_that_fit({"CPU": 64.0, "GPU": 3.0}, gpu) == 1
    assert trials_that_fit({"CPU": 64.0, "GPU": 8.0}, gpu) == 4
    # Too small a cluster still runs one trial at a time (it waits for its workers).
    assert trials_that_fit({"CPU": 1.0}, ScalingSpec(num_workers=2)) == 1


def group_state(group_id: str) -> str:
    from ray.util import placement_group_table

    return placement_group_table()[group_id]["state"]


def wait_for_state(group_id: str, state: str, timeout_s: float = 30.0) -> str:
    """The group's state once it is ``state``, or after ``timeout_s`` (the reaper polls each
    second)."""
    deadline = time.monotonic() + timeout_s
    while group_state(group_id) != state and time.monotonic() < deadline:
        time.sleep(0.2)
    return group_state(group_id)


@pytest.mark.ray
def test_reaper_removes_a_dead_controllers_group_and_a_released_watch_touches_nothing(
    ray_local,
):
    import ray
    from ray import PlacementGroupID
    from ray.exceptions import RayActorError
    from ray.util import placement_group, remove_placement_group
    from ray.util.placement_group import PlacementGroup

    from raycompat.cluster.tune.reaper import ControllerWatch

    @ray.remote(num_cpus=0)
    class Controller:  # busy in a long async run(), as Ray Train's controller is
        async def run(self):
            await asyncio.sleep(3600)

    @ray.remote(num_cpus=0)
    class Trial:  # owns the controller, as a Tune trial's actor owns its trainer's controller
        def start(self):
            self.controller = Controller.remote()
            self.controller.run.remote()
            self.group = placement_group([{"CPU": 1}])
            ray.get(self.group.ready())
            self.watch = (
                ray.remote(num_cpus=0)(ControllerWatch)
                .options(lifetime="detached", scheduling_strategy="DEFAULT")
                .remote(self.controller, 0.2)
            )
            ray.get(self.watch.guard.remote(self.group))
            return self.group.id.hex(), self.watch

    stopped = Trial.remote()
    group_id, watch = ray.get(stopped.start.remote())
    time.sleep(1.0)  # several pings answered: a live, busy controller is left alone
    assert group_state(group_id) == "CREATED"
    ray.kill(stopped)  # what Tune does to a trial ASHA stops; the controller dies with it
    assert wait_for_state(group_id, "REMOVED") == "REMOVED"
    with pytest.raises(RayActorError):  # the watch ended itself
        ray.get(watch.guard.remote(None), timeout=30)

    finished = Trial.remote()
    group_id, watch = ray.get(finished.start.remote())
    ray.kill(watch)  # PlacementGroupReaper's release on a normal shutdown
    ray.kill(finished)
    time.sleep(2.0)
    assert group_state(group_id) == "CREATED"  # nothing is watching it any more
    remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(group_id)))


def wait_for_free_cpus(ray, timeout_s: float = 120.0) -> None:
    """Every CPU of the session's Ray free, or a failure naming what still holds them. The
    sweep below needs all of them for each trial; an earlier test's actors or placement groups
    still being torn down would otherwise make its second trial wait for a worker until the
    faulthandler's 600 s (which ends the whole session without a report)."""
    total = ray.cluster_resources().get("CPU", 0)
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) < total:
        if time.monotonic() > deadline:
            from ray.util import placement_group_table

            held = {
                g: t["state"] for g, t in placement_group_table().items() if t["state"] != "REMOVED"
            }
            pytest.fail(
                f"{ray.available_resources().get('CPU', 0)} of {total} CPUs free after "
                f"{timeout_s:.0f} s; live placement groups: {held}"
            )
        time.sleep(0.5)


def load_tune_job():
    spec = importlib.util.spec_from_file_location("tune_job", ROOT / "jobs" / "tune.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


@pytest.mark.ray
@pytest.mark.slow
def test_asha_stopped_trial_gives_back_its_cpus_and_its_workers_group(ray_local, tmp_path):
    """Two trials in a row, each worker taking 3 of the session's 4 CPUs. The second trial has
    1-d features (cosine top-1 at chance), falls behind the first at ASHA's first rung and is
    stopped mid-training. Its worker group's placement group must then be removed and every CPU
    free again: what a next trial needs to get its worker (without the reaper it waits for one
    forever; the group of a trial's trainer lives as long as the sweep's driver). Each trial
    trains one model (the base's old model, digits 0-4) for two epochs: the stop comes after
    the first, while its trainer runs. (Until 2026-12-04 a third trial, equal to the first,
    showed the CPUs in use again: 25-30 s more for the same check.)"""
    from ray.util import placement_group_table

    wait_for_free_cpus(ray_local)
    before = set(placement_group_table())
    overrides = [
        "data.options={per_class: 40}",
        "epochs=2",
        "scenario.kind=cores",
        "scenario.tasks=[5]",
        "scaling.num_workers=1",
        "scaling.cpus_per_worker=3",
        # on Ray Train, whose worker group's placement group the reaper must give back (a
        # step trained in a task holds none: test_task_run.py's killed owner)
        "scaling.one_worker_runner=ray_train",
        "run.max_failures=0",
        # Ray Train's default 2 s between report collections: the second epoch then outlasts
        # ASHA's stop decision at the first rung (at 0.25 s the trial could finish first).
        "run.report_poll_s=2",
    ]
    # A sweep that waits for a worker without end (Ray Train retries the start of a worker
    # group without limit) ends the run with a traceback instead of hanging.
    faulthandler.dump_traceback_later(600, exit=True)
    try:
        summary = load_tune_job().main(
            [
                "--config",
                str(ROOT / "configs" / "tune_lr_asha.yaml"),
                f"base={ROOT / 'configs' / 'train_mnist_two_model.yaml'}",
                f"overrides={overrides!r}".replace("'", '"'),
                "space=[{key: model.embed_dim, kind: grid, values: [32, 1]}]",
                "search=grid",
                "objective=self_test",  # one model per trial: AA needs two
                "num_samples=1",
                "asha={grace_period: 1, reduction_factor: 2, max_t: 3}",
                f"storage_path={tmp_path}",
                "name=asha",
            ]
        )
    finally:
        faulthandler.cancel_dump_traceback_later()
    table = pd.read_csv(tmp_path / "asha" / "results" / "trials.csv")
    table = table.sort_values("trial").reset_index(drop=True)
    assert list(table["status"]) == ["TERMINATED", "STOPPED"], table.to_string()
    assert table.loc[1, "param:model.embed_dim"] == 1
    assert table.loc[1, "objective"] != table.loc[1, "objective"]  # NaN: no final metrics
    assert summary["status"] == {"TERMINATED": 1, "STOPPED": 1}

    # Every placement group the sweep made (Tune's trial groups and the workers') is gone.
    new_groups = set(placement_group_table()) - before
    assert len(new_groups) >= 4
    assert {wait_for_state(g, "REMOVED") for g in new_groups} == {"REMOVED"}
    wait_for_free_cpus(ray_local, timeout_s=30.0)  # all 4 CPUs: a next trial's worker fits
