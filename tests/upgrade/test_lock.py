"""Decisions are never overwritten, and one upgrade job runs per gallery (issue 22, item 4).

Driven through the decision store, the ``Upgrader``'s recording (its training and judging
replaced by a stand-in, as in test_open_set.py) and the job lease; no Ray, no training.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys

import pytest

from raycompat.config import load_config
from raycompat.config.upgrade import UpgradeConfig
from raycompat.store import GalleryStore
from raycompat.store.catalog.decisions import DecisionConflictError, DecisionRecord, Decisions
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.upgrade.lock import UpgradeRunningError, lease_dir, upgrade_lease
from raycompat.upgrade.report import Outcome
from tests.conftest import store_with_v1

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))




def _files(tmp_path) -> dict[str, bytes]:
    folder = tmp_path / "store" / "mnist" / "_decisions" / "m2"
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_each_decision_is_a_new_record_and_a_failure_never_stands_over_a_refusal(tmp_path):
    decisions = Decisions(store_with_v1(tmp_path))
    decisions.put(DecisionRecord("mnist", "m2", "refused", "ECC fails", "d1", "m1"))
    first = _files(tmp_path)
    decisions.put(DecisionRecord("mnist", "m2", "failed", "RuntimeError: race", "d1", "m1"))

    files = _files(tmp_path)
    assert list(files) == ["00000001.json", "00000002.json"]
    assert files["00000001.json"] == first["00000001.json"]  # never rewritten
    assert [a.outcome for a in decisions.attempts("mnist", "m2")] == ["refused", "failed"]
    standing = decisions.get("mnist", "m2")
    assert (standing.outcome, standing.reason, standing.attempt) == ("refused", "ECC fails", 1)
    decisions.put(DecisionRecord("mnist", "m2", "failed", "boom", "d2"))  # a changed config
    assert decisions.get("mnist", "m2").outcome == "failed"
    assert decisions.get("mnist", "m2", "d1").outcome == "refused"


def test_two_runs_racing_for_one_attempt_cannot_overwrite_each_other(tmp_path):
    store = store_with_v1(tmp_path)
    first, second = Decisions(store), Decisions(store)
    second.attempts = lambda gallery, model: []  # read before the first run recorded
    first.put(DecisionRecord("mnist", "m2", "refused", "ECC fails", "d1", "m1"))
    before = _files(tmp_path)

    with pytest.raises(DecisionConflictError, match="attempt 1 of 'm2' first .refused: ECC"):
        second.put(DecisionRecord("mnist", "m2", "failed", "RuntimeError: race", "d1"))
    assert _files(tmp_path) == before


class _Judge:
    """Stands in for the training and judging of one entry (the part that needs Ray)."""

    def __init__(self, action="refuse", error=None):
        self.action, self.error = action, error

    def __call__(self, position, spec, current, mine):
        if self.error is not None:
            raise self.error
        return Outcome(spec.model_version, spec.method, spec.classes, self.action, "ECC fails")


def _upgrader(tmp_path, store, judge, retry=False):
    from raycompat.cluster.upgrade.job import Upgrader

    cfg = load_config(UpgradeConfig, None, [f"work_dir={tmp_path}/work"])
    upgrader = Upgrader(cfg, store, Catalog(store), data=None, retry=retry)
    upgrader._upgrade = judge
    return upgrader


def test_a_failed_retry_keeps_the_refusal_and_a_published_model_records_no_failure(tmp_path):
    store = store_with_v1(tmp_path)
    _upgrader(tmp_path, store, _Judge()).run(1)
    refusal = _files(tmp_path)["00000001.json"]
    crash = _Judge(error=RuntimeError("checkpoint dir exists\nsecond line"))
    with pytest.raises(RuntimeError):
        _upgrader(tmp_path, store, crash, retry=True).run(1)

    assert _files(tmp_path)["00000001.json"] == refusal
    assert Decisions(store).get("mnist", "m2").outcome == "refused"
    skipped = _upgrader(tmp_path, store, _Judge(error=AssertionError("not judged"))).run(1)
    assert skipped.action == "refuse" and skipped.resumed

    catalog = Catalog(store)  # another job publishes m2 while this one fails
    catalog.register_model(ModelRecord("m2", "", 9, method="cores"))
    catalog.grant(QueryGrant("mnist", "v1", "m2", "compatible"))
    upgrader = _upgrader(tmp_path, store, crash, retry=True)
    upgrader._record_failure(upgrader.cfg.upgrades[1], "RuntimeError: late", None)
    assert len(_files(tmp_path)) == 2 and Decisions(store).get("mnist", "m2") is None


def test_a_second_job_on_the_gallery_is_refused_naming_the_live_one(tmp_path, monkeypatch):
    store = GalleryStore(str(tmp_path / "store"))
    monkeypatch.setenv("RAYCOMPAT_JOB", "first-job")
    with upgrade_lease(store, "mnist", timeout_s=60):
        monkeypatch.setenv("RAYCOMPAT_JOB", "second-job")
        with pytest.raises(UpgradeRunningError) as refused:
            with upgrade_lease(store, "mnist", timeout_s=60):
                pass
        with upgrade_lease(store, "other", timeout_s=60):  # another gallery is not held
            pass
    message = str(refused.value)
    assert "\n" not in message and "gallery 'mnist' is being upgraded by job 'first-job'" in message
    assert f"on host {socket.gethostname()!r} (pid {os.getpid()})" in message
    assert re.search(r"last heartbeat \S+ \(\d+ s ago, timeout 60 s\)", message)
    assert lease_dir(store, "mnist").startswith(str(tmp_path / "store" / "_jobs"))

    with pytest.raises(KeyError):  # released when the job ends, also by an error
        with upgrade_lease(store, "mnist", timeout_s=60):
            raise KeyError("boom")
    with upgrade_lease(store, "mnist", timeout_s=60):
        assert store.galleries() == []  # the job folder is no gallery


def test_the_job_stops_before_ray_when_the_gallery_is_being_upgraded(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("upgrade_job", os.path.join(ROOT, "jobs",
                                                                             "upgrade.py"))
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    store = GalleryStore(str(tmp_path / "store"))
    monkeypatch.setenv("RAYCOMPAT_JOB", "first-job")
    monkeypatch.setattr(sys, "argv", ["jobs/upgrade.py"])
    with upgrade_lease(store, "mnist", timeout_s=60):
        with pytest.raises(SystemExit) as refused:
            job.main([f"store.root={tmp_path}/store", f"work_dir={tmp_path}/work"])
    line = str(refused.value.code)
    assert "\n" not in line and line.startswith("upgrade.py: error: ")  # run_main's one line
    assert "gallery 'mnist' is being upgraded by job 'first-job'" in line
