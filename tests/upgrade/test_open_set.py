"""Open-set evaluation (``eval.split: open_set``) and the record of refused or failed upgrades.

The splits are checked on real labels (MNIST-5k's), without Ray: the test classes are held out
whole, disjoint from training and validation, the same on every call, and a model that would
train on one is refused before any training starts.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from raycompat.config import load_config
from raycompat.config.train import TrainConfig
from raycompat.config.upgrade import UpgradeConfig, check_upgrade_config, decision_digest
from raycompat.errors import ConfigError, CorruptFileError
from raycompat.store.catalog.decisions import DecisionRecord, Decisions
from raycompat.store.catalog.models import Catalog
from raycompat.train.data import describe_split, make_splits
from raycompat.upgrade.report import Outcome
from tests.conftest import store_with_v1

OPEN = ["eval.split=open_set", "eval.test_classes=[7, 8, 9]"]


@pytest.fixture(scope="module")
def labels():
    from raycompat.data import create_dataset

    return np.asarray(create_dataset("mnist5k").labels)


def test_open_set_holds_out_every_image_of_the_test_classes_and_only_those(labels):
    cfg = load_config(TrainConfig, None, OPEN)
    splits = make_splits(cfg, labels)
    test = set(splits.test.tolist())
    assert test == set(np.flatnonzero(np.isin(labels, [7, 8, 9])).tolist())
    assert not test & set(splits.train.tolist()) and not test & set(splits.val.tolist())
    assert not set(splits.train.tolist()) & set(splits.val.tolist())
    assert len(splits.train) + len(splits.val) + len(splits.test) == len(labels)
    assert set(np.unique(labels[splits.train]).tolist()) == set(range(7))
    again = make_splits(cfg, labels)  # deterministic: the same rows every time
    for a, b in zip(splits.__dict__.values(), again.__dict__.values(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_closed_set_tests_on_the_training_classes(labels):
    splits = make_splits(load_config(TrainConfig), labels)
    assert set(np.unique(labels[splits.test]).tolist()) == set(range(10))
    assert set(np.unique(labels[splits.train]).tolist()) == set(range(10))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["eval.split=open_set"], "needs eval.test_classes"),
        (["eval.test_classes=[7]"], "only used with eval.split: open_set"),
        ([*OPEN[:1], "eval.test_classes=[7, 7]"], "must be distinct labels"),
        ([*OPEN[:1], "eval.test_classes=[12]"], "no images of class(es) [12]"),
        ([*OPEN, "eval.dataset={name: mnist5k}"], "leave eval.split at closed_set"),
    ],
)
def test_inconsistent_splits_are_refused(labels, overrides, message):
    cfg = load_config(TrainConfig, None, overrides)
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_splits(cfg, labels)


def test_a_split_named_as_protocol_says_where_it_belongs():
    with pytest.raises(ConfigError, match="set eval.split: open_set"):
        load_config(TrainConfig, None, ["eval.protocol=open_set"])


def test_an_upgrade_that_would_train_on_a_test_class_is_refused_naming_it():
    cfg = load_config(UpgradeConfig)
    check_upgrade_config(cfg)  # the default: digits 0-6 trained, 7-9 tested
    cfg.upgrades[2].classes = 9
    with pytest.raises(ConfigError, match=r"upgrades\[2\]\.classes=9 trains on class\(es\) \[7, 8"):
        check_upgrade_config(cfg)


def test_a_training_scenario_on_a_test_class_is_refused_before_ray():
    from raycompat.cluster.train.driver import preflight
    from raycompat.train.scenarios import plan_steps

    cfg = load_config(TrainConfig, None, [*OPEN, "scenario.kind=cores", "scenario.tasks=[4, 9]"])
    labels = np.repeat(np.arange(10), 5)
    with pytest.raises(ConfigError, match=r"step_2 trains on class\(es\) \[7, 8\]"):
        preflight(cfg, plan_steps(cfg), labels, make_splits(cfg, labels))


def test_reports_say_which_images_every_table_uses(tmp_path):
    from raycompat.metrics.compatibility import CompatibilityMatrix
    from raycompat.upgrade.report import Report, markdown

    open_text = describe_split(load_config(TrainConfig, None, OPEN))
    assert open_text.startswith("open-set") and "[7, 8, 9]" in open_text
    assert "no model in the history trained on" in open_text
    assert describe_split(load_config(TrainConfig)).startswith("closed-set: 20%")
    matrix = CompatibilityMatrix.from_array(np.array([[0.5]]), ["m1"])
    report = Report("r", "identification", matrix, [], [], split=open_text)
    text = markdown(report, {"matrix": "m.png"})
    assert f"Test images: {open_text}." in text
    assert report.summary()["split"] == open_text


# ---- refused and failed upgrades are recorded and skipped while their config is unchanged ----


def test_decision_records_round_trip_and_a_corrupt_one_names_its_file(tmp_path):
    store = store_with_v1(tmp_path)
    decisions = Decisions(store)
    assert decisions.get("mnist", "m2") is None
    decisions.put(DecisionRecord("mnist", "m2", "refused", "ECC fails", "d1", "m1", {"x": 1}))
    got = decisions.get("mnist", "m2")
    assert (got.outcome, got.digest, got.against, got.evidence) == ("refused", "d1", "m1", {"x": 1})
    decisions.put(DecisionRecord("mnist", "m2", "failed", "boom", "d2"))  # a later judgement
    assert decisions.get("mnist", "m2").digest == "d2"
    path = tmp_path / "store" / "mnist" / "_decisions" / "m2.json"
    path.write_text('{"gallery": "mnist"')
    with pytest.raises(CorruptFileError, match="m2.json"):
        decisions.get("mnist", "m2")
    assert [v.version for v in store.versions("mnist")] == ["v1"]  # listing unaffected


class _Recorder:
    """Stands in for the training + judging of one entry (the part that needs Ray)."""

    def __init__(self, action="refuse", error=None):
        self.calls, self.action, self.error = 0, action, error

    def __call__(self, position, spec, current, mine):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return Outcome(spec.model_version, spec.method, spec.classes, self.action, "ECC fails")


def _upgrader(tmp_path, store, overrides=(), retry=False):
    from raycompat.cluster.upgrade.job import Upgrader

    cfg = load_config(UpgradeConfig, None, [f"work_dir={tmp_path}/work", *overrides])
    upgrader = Upgrader(cfg, store, Catalog(store), data=None, retry=retry)
    return cfg, upgrader


def test_a_refused_upgrade_is_skipped_on_rerun_unless_its_config_changed_or_retry(tmp_path):
    store = store_with_v1(tmp_path)
    cfg, first = _upgrader(tmp_path, store)
    first._upgrade = judge = _Recorder()
    outcome = first.run(1)
    assert outcome.action == "refuse" and judge.calls == 1 and not outcome.resumed
    record = Decisions(store).get("mnist", "m2")
    assert record.outcome == "refused" and record.against == "m1"
    assert record.digest == decision_digest(cfg, cfg.upgrades[1], "m1")

    _, again = _upgrader(tmp_path, store)  # same config: skipped, not trained or judged
    again._upgrade = judge
    skipped = again.run(1)
    assert judge.calls == 1 and skipped.resumed and skipped.action == "refuse"
    assert "skipped: same config, --retry to rerun" in skipped.reason

    _, retried = _upgrader(tmp_path, store, retry=True)
    retried._upgrade = judge
    retried.run(1)
    assert judge.calls == 2

    _, changed = _upgrader(tmp_path, store)
    changed.cfg.upgrades[1].method_options = {"lam": 0.2, "rho": 5.0}
    changed._upgrade = _Recorder(action="compatible")
    assert changed.run(1).action == "compatible" and changed._upgrade.calls == 1
    assert Decisions(store).get("mnist", "m2") is None  # a success clears the record


def test_a_failed_upgrade_is_recorded_raised_and_then_skipped(tmp_path):
    from raycompat.engine import NonFiniteError

    store = store_with_v1(tmp_path)
    _, first = _upgrader(tmp_path, store)
    first._upgrade = _Recorder(error=NonFiniteError("epoch 0 step 3: loss 'ce' is nan"))
    with pytest.raises(NonFiniteError):
        first.run(1)
    record = Decisions(store).get("mnist", "m2")
    assert record.outcome == "failed" and "loss 'ce' is nan" in record.reason
    _, again = _upgrader(tmp_path, store)
    again._upgrade = judge = _Recorder()
    skipped = again.run(1)
    assert judge.calls == 0 and skipped.action == "failed" and "NonFiniteError" in skipped.reason


def test_the_digest_ignores_where_runs_are_kept_but_not_what_is_trained():
    cfg = load_config(UpgradeConfig)
    base = decision_digest(cfg, cfg.upgrades[1], "m1")
    moved = load_config(UpgradeConfig, None, ["training.run.storage_path=/elsewhere"])
    assert decision_digest(moved, moved.upgrades[1], "m1") == base
    assert decision_digest(cfg, cfg.upgrades[1], "m0") != base
    lr = load_config(UpgradeConfig, None, ["training.optim.lr=0.01"])
    assert decision_digest(lr, lr.upgrades[1], "m1") != base


def test_decisions_made_before_the_stopping_rule_keep_their_digest():
    """training.stop (2026-12-01) at its default changes no stored decision's digest: a store
    the demo wrote before it is skipped on rerun, not judged again; a plateau rule is another
    config. The value is the embedded history's m2 digest as the code before the rule gave."""
    cfg = load_config(UpgradeConfig)
    assert decision_digest(cfg, cfg.upgrades[1], "m1") == (
        "512e67e50926049bab095bf15f3a1092b3ac5af6c2d93d3c8ad5cc1872b2f017"
    )
    plateau = load_config(UpgradeConfig, None, ["training.stop.rule=plateau"])
    assert decision_digest(plateau, plateau.upgrades[1], "m1") != decision_digest(
        cfg, cfg.upgrades[1], "m1"
    )


def test_a_missing_weights_file_is_refused_before_ray_naming_the_key(tmp_path):
    missing = tmp_path / "dinov3.safetensors"
    cfg = load_config(UpgradeConfig, None, [f"training.model.weights={missing}"])
    expected = f"training.model.weights: no file at '{missing}'"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check_upgrade_config(cfg)
    missing.write_bytes(b"weights")  # present: opening it is all that is checked here
    check_upgrade_config(cfg)
