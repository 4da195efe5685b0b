"""The upgrade job's FastFill partial backfill, pure pieces: config, decision, curves, report.

The end-to-end run (train, decide, write the version with the Ray pipeline, report) is in
tests/cluster/upgrade/test_job.py.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from raycompat.config import load_config
from raycompat.config.upgrade import (
    PartialBackfillSpec,
    PolicySpec,
    UpgradeConfig,
    UpgradeSpec,
    check_upgrade_config,
    decision_digest,
    partial_backfill_of,
)
from raycompat.errors import ConfigError
from raycompat.evaluation import EvalSet
from raycompat.metrics.compatibility import CompatibilityMatrix
from raycompat.upgrade.backfill_eval import backfill_evaluation
from raycompat.upgrade.evaluate import EvalData, evidence
from raycompat.upgrade.policy import decide
from raycompat.upgrade.report import Outcome, Report, write_report

FCT = "upgrades=[{model_version: m1, classes: 3}, {model_version: m2, classes: 5, method: fct, "


def history(partial: str) -> list[str]:
    return [FCT + f"partial_backfill: {partial}}}]"]


# ---- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (history("{budget: -0.1}"), "upgrades[1].partial_backfill.budget must be >= 0.0"),
        (history("{budget: 1.5}"), "upgrades[1].partial_backfill.budget must be <= 1.0"),
        (history("{budget: .nan}"), "upgrades[1].partial_backfill.budget must be >= 0.0, got nan"),
        (history("{budget: half}"), "upgrades[1].partial_backfill.budget: expected float"),
        (history("{order: uncertainty}"), "missing required config key(s): "),
        (history("{budget: 0.3, order: oracle}"), "upgrades[1].partial_backfill.order: 'oracle'"),
        (history("{budget: 0.3, target: 0}"), "upgrades[1].partial_backfill.target must be > 0"),
        (
            history("{budget: 0.3, uncertainty_weight: -1}"),
            "upgrades[1].partial_backfill.uncertainty_weight must be >= 0",
        ),
        (["policy.partial_backfill.budget=2"], "policy.partial_backfill.budget must be <= 1.0"),
        (["policy.on_incompatible=partial"], "policy.on_incompatible: 'partial' is not one of"),
        (
            [
                "upgrades=[{model_version: m1, classes: 3}, {model_version: m2, classes: 5, "
                "method: cores, partial_backfill: {budget: 0.3}}]"
            ],
            "upgrades[1].partial_backfill: method 'cores' learns no transformation",
        ),
    ],
)
def test_bad_partial_backfill_configs_are_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_upgrade_config(load_config(UpgradeConfig, None, overrides))


def test_budgets_of_configs_built_in_python_are_checked_like_loaded_ones():
    cfg = load_config(UpgradeConfig, None, history("{budget: 0.5}"))
    check_upgrade_config(cfg)
    assert cfg.upgrades[1].partial_backfill == PartialBackfillSpec(budget=0.5)
    cfg.upgrades[1].partial_backfill.budget = float("nan")
    with pytest.raises(ConfigError, match=r"upgrades\[1\]\.partial_backfill\.budget"):
        check_upgrade_config(cfg)
    cfg.upgrades[1].partial_backfill = None
    cfg.policy.partial_backfill.budget = -0.5
    with pytest.raises(ConfigError, match=r"policy\.partial_backfill\.budget"):
        check_upgrade_config(cfg)


def test_the_demo_partially_backfills_its_fct_entry():
    cfg = UpgradeConfig()
    m3 = cfg.upgrades[2]
    assert m3.method == "fct" and m3.partial_backfill.budget == 0.3
    assert m3.partial_backfill.order == "uncertainty"
    check_upgrade_config(cfg)


def test_which_partial_backfill_applies_and_the_digest_covers_it():
    own = PartialBackfillSpec(budget=0.5, order="random")
    entry = UpgradeSpec("m2", 5, "fct", partial_backfill=own)
    plain = UpgradeSpec("m2", 5, "fct")
    refuse, allow = PolicySpec(), PolicySpec("partial_backfill")
    assert partial_backfill_of(entry, refuse) is own
    assert partial_backfill_of(plain, refuse) is None
    assert partial_backfill_of(plain, allow) is allow.partial_backfill

    cfg = UpgradeConfig()
    digests = {decision_digest(cfg, plain, "m1"), decision_digest(cfg, entry, "m1")}
    cfg.policy = PolicySpec(partial_backfill=PartialBackfillSpec(budget=0.4))
    digests.add(decision_digest(cfg, plain, "m1"))
    cfg.policy = PolicySpec("partial_backfill")
    digests.add(decision_digest(cfg, plain, "m1"))
    assert len(digests) == 4  # every change is judged again


# ---- decision --------------------------------------------------------------------------------


def ev(cross, old_self, new_self=0.9, against="m1"):
    data = EvalData(None, np.zeros(0), EvalSet(np.zeros(0)), "identification", "cosine", True, 8)
    data.score = lambda q, g: {("n", "g"): cross, ("n", "n"): new_self}[(q, g)]
    return evidence(data, "n", "g", old_self, against)


OWN = PartialBackfillSpec(budget=0.3)


@pytest.mark.parametrize(
    ("direct", "fct", "policy", "own", "action"),
    [
        # the entry asks for it: taken whether h alone passes ECC or not
        ((0.1, 0.6), (0.7, 0.6), "refuse", OWN, "partial_backfill"),
        ((0.1, 0.6), (0.5, 0.6), "refuse", OWN, "partial_backfill"),
        ((0.7, 0.6), (0.5, 0.6), "backfill", OWN, "partial_backfill"),
        # the policy allows it: only when h(gallery) fails ECC
        ((0.1, 0.6), (0.7, 0.6), "partial_backfill", None, "transform"),
        ((0.1, 0.6), (0.5, 0.6), "partial_backfill", None, "partial_backfill"),
        # without h there is nothing to backfill partially: refused, never a full backfill
        ((0.5, 0.6), None, "partial_backfill", None, "refuse"),
        ((0.7, 0.6), None, "partial_backfill", None, "compatible"),
        # a non-FCT entry cannot carry partial_backfill (config), and it would not apply
        ((0.5, 0.6), None, "refuse", OWN, "refuse"),
    ],
)
def test_partial_backfill_decision_table(direct, fct, policy, own, action):
    decision = decide(ev(*direct), ev(*fct) if fct else None, PolicySpec(policy), own)
    assert decision.action == action, decision.reason
    if action == "partial_backfill":
        assert "30% of the rows re-extracted, uncertainty order" in decision.reason
        assert "h(m1)" in decision.reason
    if action == "refuse" and policy == "partial_backfill":
        assert "needs an FCT transformation h" in decision.reason


# ---- curves ----------------------------------------------------------------------------------


def hand_made():
    """Four test images of two classes; h maps image 0 into class 1's direction and is most
    uncertain about it. By hand (cosine, query excluded by index): with h(old) only image 0's
    query finds its class (top-1 1/4); once images 0 and 1 are backfilled every query does."""
    labels = np.array([0, 0, 1, 1])
    new = np.array([[1, 0.1], [1, -0.1], [0.1, 1], [-0.1, 1]], np.float32)
    transformed = new.copy()
    transformed[0] = [0, 1]
    uncertainty = np.array([5.0, 0.0, 0.0, 0.0], np.float32)
    return new, transformed, uncertainty, labels


def test_backfill_evaluation_by_hand():
    new, transformed, uncertainty, labels = hand_made()
    spec = PartialBackfillSpec(budget=0.25, target=0.95)
    out = backfill_evaluation(
        new, transformed, uncertainty, labels, spec, fractions=[0, 0.5, 1], random_seeds=[0, 1]
    )
    assert out["fractions"] == [0.0, 0.5, 1.0] and out["random_seeds"] == [0, 1]
    ours = out["summary"]["uncertainty"]
    assert out["curves"]["uncertainty"]["top1"] == [0.25, 1.0, 1.0]
    assert ours["auc_top1"] == pytest.approx(0.5 * (0.25 + 1) / 2 + 0.5)
    assert ours["top1_at_budget"] == pytest.approx(0.625)  # halfway between 0.25 and 1.0
    assert ours["budget_for_target"] == 0.5
    assert out["curves"]["oracle"]["top1"] == [0.25, 1.0, 1.0]  # image 0 has the true error
    json.dumps(out)  # plain numbers: it goes into report.json


# ---- report ----------------------------------------------------------------------------------


def test_the_report_renders_the_partial_backfill_section_and_plot(tmp_path):
    from raycompat.cli.app import main

    new, transformed, uncertainty, labels = hand_made()
    backfill = backfill_evaluation(
        new, transformed, uncertainty, labels, PartialBackfillSpec(budget=0.25)
    )
    proof = {"direct": ev(0.1, 0.6).as_dict(), "transformed": ev(0.5, 0.6).as_dict()}
    outcomes = [
        Outcome("m1", "independent", 3, "initial", "first"),
        Outcome("m2", "fct", 5, "partial_backfill", "asked", "m1", "v2", proof, backfill=backfill),
    ]
    matrix = CompatibilityMatrix.from_array(np.array([[0.6, 0], [0.5, 0.9]]), names=["m1", "m2"])
    report = Report(
        "toy",
        "identification",
        matrix,
        outcomes,
        [],
        split="closed-set: 25% of every class's images held out",
    )
    files = write_report(tmp_path, report, {"name": "toy"})
    assert files["backfill_m2"] == "backfill_m2.png" and "backfill_m1" not in files
    assert (tmp_path / "backfill_m2.png").stat().st_size > 0
    text = (tmp_path / "report.md").read_text()
    assert "## Partial backfill" in text
    assert "On the test images (closed-set: 25% of every class's images held out)" in text
    assert "### m2 (fct): budget 25%, uncertainty order" in text
    header = "| order | AUC top-1 | AUC mAP | top-1 at 25% | budget for 95% of new/new top-1 |"
    assert header in text
    # Default grid, 4 rows: image 0 is backfilled from 20% (round(0.2 * 4) = 1) on, so the
    # top-1 area is 0.1 * 0.25 + 0.1 * (0.25 + 1) / 2 + 0.8 * 1.
    mean_ap = backfill["summary"]["uncertainty"]["auc_mean_ap"] * 100
    assert f"| uncertainty (FastFill) | 88.75 | {mean_ap:.2f} | 100.00 | 20% |" in text
    assert "| random |" in text and "| oracle (true error) |" in text
    assert "The oracle is not the best order for top-1" in text
    assert "![partial backfill of m2](backfill_m2.png)" in text
    assert "**partial_backfill**" in text
    body = json.loads((tmp_path / "report.json").read_text())
    assert body["outcomes"][1]["backfill"]["summary"]["uncertainty"]["budget_for_target"] == 0.2
    assert main(["report", str(tmp_path)]) == 0  # `raycompat report` prints report.md


def test_no_section_without_an_uncertain_h(tmp_path):
    matrix = CompatibilityMatrix.from_array(np.array([[0.6]]), names=["m1"])
    report = Report("toy", "identification", matrix, [Outcome("m1", "x", 3, "initial", "")], [])
    files = write_report(tmp_path, report, {"name": "toy"})
    assert not [f for f in files if f.startswith("backfill_")]
    assert "Partial backfill" not in (tmp_path / "report.md").read_text()


def test_a_published_partial_backfill_is_reported_as_such_on_rerun(tmp_path):
    from raycompat.cluster.upgrade.job import Upgrader
    from raycompat.store import GalleryStore, VersionInfo, embedding_table
    from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

    store = GalleryStore(str(tmp_path / "store"))
    catalog = Catalog(store)
    staging = store.begin("mnist", VersionInfo("v3", "m3", 9, False, "v3 = h_m3(v1), 30%"))
    staging.write_table(
        embedding_table(np.arange(4), np.ones((4, 9), np.float32)), "part-0.parquet"
    )
    staging.commit()
    catalog.register_model(ModelRecord("m1", "", 9))
    catalog.register_model(ModelRecord("m3", "", 9, parent="m1"))
    evidence_ = {"reason": "why", "partial_backfill": {"budget": 0.3, "extracted": 2}}
    grant = catalog.grant(QueryGrant("mnist", "v3", "m3", "transformed", evidence_))
    cfg = load_config(UpgradeConfig, None, [f"work_dir={tmp_path}/work"])
    upgrader = Upgrader(cfg, store, catalog, data=None)
    cache = tmp_path / "work" / cfg.name / "features"
    cache.mkdir(parents=True)
    np.save(cache / "m3.npy", np.zeros((3, 9), np.float32))
    outcome = upgrader._resumed(cfg.upgrades[2], grant)
    assert (outcome.action, outcome.resumed) == ("partial_backfill", True)
    assert outcome.evidence["partial_backfill"]["extracted"] == 2


def test_a_partial_backfill_written_before_a_crash_is_granted_with_its_evidence(tmp_path):
    """The version exists (an earlier run committed it, then stopped): act() does not write it
    again, and the grant says how much of it was re-extracted."""
    import torch

    from raycompat.cluster.upgrade.job import Upgrader
    from raycompat.config.train import ModelSpec
    from raycompat.store import GalleryStore, VersionInfo, embedding_table
    from raycompat.store.catalog.models import Catalog, ModelRecord
    from raycompat.train.export import build_model, export_model
    from raycompat.upgrade.policy import Decision

    store = GalleryStore(str(tmp_path / "store"))
    written = []
    for version, model in (("v1", "m1"), ("v3", "m3")):
        staging = store.begin("mnist", VersionInfo(version, model, 9, False, f"{version} = x"))
        staging.write_table(
            embedding_table(np.arange(10), np.ones((10, 9), np.float32)), "part-0.parquet"
        )
        written.append(staging.commit())
    torch.manual_seed(0)
    spec = ModelSpec(backbone="lenetpp", head="dsimplex", num_classes=10)
    export_model(tmp_path / "m3", build_model(spec).state_dict(), spec, label_map={"0": 0})
    cfg = UpgradeConfig()
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", "", 9))
    upgrader = Upgrader(cfg, store, catalog, data=None)
    decision, version = upgrader.publisher.act(
        2,
        cfg.upgrades[2],  # the demo's m3: partial_backfill budget 0.3, uncertainty order
        Decision("partial_backfill", "asked"),
        str(tmp_path / "m3"),
        np.zeros((4, 9), np.float32),
        written[0],
        written[1],
        0.5,
        {"direct": {"ecc": False}},
        "m1",
    )
    assert (decision.action, version) == ("partial_backfill", "v3")
    assert [v.version for v in store.versions("mnist")] == ["v1", "v3"]
    grant = catalog.queryable_version("mnist", "m3")
    assert (grant.gallery_version, grant.relation) == ("v3", "transformed")
    assert grant.evidence["partial_backfill"] == {
        "budget": 0.3,
        "order": "uncertainty",
        "extracted": 3,
    }
    assert grant.evidence["reason"] == "asked" and catalog.model("m3").parent == "m1"
