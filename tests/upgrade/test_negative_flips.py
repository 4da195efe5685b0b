"""Negative flips in the upgrade's evidence, the policy's NFR gate, and one number per cell.

The NFR (Yan et al., CVPR 2021) of an upgrade: the share of the test queries that the old system
(the gallery model's queries against its gallery) answered right at top-1 and the upgraded one
answers wrong; "of old hits": the same share of the queries the old system answered right.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from raycompat.backfill import random_order
from raycompat.config import load_config
from raycompat.config.upgrade import (
    PartialBackfillSpec,
    PolicySpec,
    UpgradeConfig,
    decision_digest,
)
from raycompat.evaluation import EvalSet
from raycompat.metrics import identification_flips
from raycompat.metrics.compatibility import CompatibilityMatrix
from raycompat.upgrade.backfill_eval import backfill_evaluation
from raycompat.upgrade.evaluate import (
    EvalData,
    Evidence,
    evidence,
    history_matrix,
    holds_features,
    partially_backfilled,
)
from raycompat.upgrade.policy import decide
from raycompat.upgrade.report import Outcome, Report, write_report

LABELS = np.array([0, 0, 1, 1])


def unit(degrees) -> np.ndarray:
    """Unit vectors at the given angles: under cosine, the nearest other image is the one at
    the smallest angle."""
    radians = np.deg2rad(np.asarray(degrees, dtype=np.float64))
    return np.stack([np.cos(radians), np.sin(radians)], axis=1).astype(np.float32)


def identification(labels=LABELS, protocol="identification") -> EvalData:
    return EvalData(None, np.arange(len(labels)), EvalSet(labels), protocol, "cosine", True, 8)


# Old features at 0, 20, 90, 50 degrees (labels 0, 0, 1, 1), query excluded by index:
#   q0 -> 20 (img 1, hit); q1 -> 0 (img 0, hit); q2 -> 50 (img 3, hit);
#   q3 (50) -> 20 (30 deg, img 1) before 90 (40 deg): miss.          old hits T T T F
# New queries at 5, 40, 70, 85 against the old gallery:
#   n0 -> 20 (hit); n1 (40) -> 50 (img 3): miss; n2 (70) -> 50 (img 3, hit);
#   n3 (85) -> 90 (img 2, hit).                                         new hits T F T T
# New queries against their own gallery (a full backfill):
#   n0 -> 40 (img 1, hit); n1 (40) -> 70 (30 deg, img 2) before 5 (35 deg): miss;
#   n2 -> 85 (hit); n3 -> 70 (hit).                                     new hits T F T T
OLD = unit([0, 20, 90, 50])
NEW = unit([5, 40, 70, 85])


def test_the_evidence_counts_negative_flips_by_hand():
    data = identification()
    old_hits = data.hits(OLD, OLD)
    assert old_hits.hit.tolist() == [True, True, True, False] and old_hits.valid.all()
    e = evidence(data, NEW, OLD, data.score(OLD, OLD), "m1", old_hits=old_hits)
    assert (e.old_self, e.cross, e.new_self) == (0.75, 0.75, 0.75)
    # query 1: right before, wrong after: 1 of 4 queries, 1 of the 3 the old system got right
    assert e.negative_flip_rate == pytest.approx(1 / 4)
    assert e.negative_flip_rate_of_old_hits == pytest.approx(1 / 3)
    assert e.backfill_negative_flip_rate == pytest.approx(1 / 4)
    assert e.backfill_negative_flip_rate_of_old_hits == pytest.approx(1 / 3)
    reference = identification_flips(OLD, OLD, NEW, OLD, LABELS)  # raycompat.metrics
    assert e.negative_flip_rate == reference.negative
    json.dumps(e.as_dict())  # plain numbers: it goes into report.json and decision records


def test_flips_are_counted_only_with_the_old_hits_and_only_under_identification():
    data = identification()
    assert evidence(data, NEW, OLD, 0.75, "m1").negative_flip_rate is None
    verification = identification(protocol="verification")
    assert verification.hits(OLD, OLD) is None


def test_hits_average_to_the_score_across_widths():
    """A wider new model against an older one: hits use the first min(d) coordinates, as the
    score does (BCT), so their mean is the matrix cell."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(5), 6)
    data = identification(labels)
    query, gallery = rng.normal(size=(30, 7)), rng.normal(size=(30, 4))
    hits = data.hits(query, gallery)
    assert hits.hit[hits.valid].mean() == pytest.approx(data.score(query, gallery), abs=1e-12)


def test_stored_rows_of_the_models_own_features_are_those_features():
    data = identification()
    scaled = OLD * np.array([[2.0], [3.0], [0.5], [1.0]], np.float32)  # stored normalised
    assert holds_features(data, OLD, scaled)
    assert holds_features(data, OLD.astype(np.float64), scaled)  # float64 features, float32 rows
    assert not holds_features(data, NEW, OLD)  # another gallery (h(rows), a backfill)
    assert not holds_features(data, OLD[:, :1], OLD)
    l2 = dataclasses.replace(data, distance="l2")  # raw features: the norm is part of them
    assert not holds_features(l2, OLD, scaled)


def test_the_partially_backfilled_test_gallery_by_hand():
    transformed = np.zeros((4, 2), np.float32)
    new = np.arange(1, 9, dtype=np.float32).reshape(4, 2)
    uncertainty = np.array([0.1, 0.9, 0.5, 0.0])
    spec = PartialBackfillSpec(budget=0.5)  # round(0.5 * 4) = 2 rows: the most uncertain
    got = partially_backfilled(transformed, new, uncertainty, spec, seed=0)
    np.testing.assert_array_equal(got, [[0, 0], [3, 4], [5, 6], [0, 0]])
    spec = PartialBackfillSpec(budget=0.25, order="random")
    got = partially_backfilled(transformed, new, uncertainty, spec, seed=3)
    row = random_order(4, 3)[0]
    assert np.flatnonzero(got.any(axis=1)).tolist() == [row]
    np.testing.assert_array_equal(transformed, 0)  # not modified


def test_the_backfilled_row_is_the_curves_value_at_the_budget():
    """One number: M(new, partial backfill) in the evidence is the uncertainty curve's top-1
    at the budget (0.3 is on the default grid)."""
    rng = np.random.default_rng(2)
    labels = np.repeat(np.arange(4), 5)
    new = (np.eye(4)[labels] + 0.4 * rng.normal(size=(20, 4))).astype(np.float32)
    transformed = (new + 0.8 * rng.normal(size=(20, 4))).astype(np.float32)
    uncertainty = rng.random(20)
    spec = PartialBackfillSpec(budget=0.3)
    curves = backfill_evaluation(new, transformed, uncertainty, labels, spec)
    data = identification(labels)
    mixed = partially_backfilled(transformed, new, uncertainty, spec, seed=0)
    e = evidence(data, new, mixed, 0.5, "m1", transformed=True)
    # np.interp at the grid point 0.3 (linspace's 0.30000000000000004): equal to rounding
    assert e.cross == pytest.approx(curves["summary"]["uncertainty"]["top1_at_budget"], abs=1e-12)


# ---- the policy's gate ---------------------------------------------------------------------


def made(cross, old_self, nfr=None, backfill_nfr=None, new_self=0.9) -> Evidence:
    """Hand-made evidence: ECC by ``cross > old_self``, the NFRs as given."""
    return Evidence(
        "m1",
        cross,
        old_self,
        new_self,
        cross > old_self,
        None,
        negative_flip_rate=nfr,
        backfill_negative_flip_rate=backfill_nfr,
    )


PB = "partial_backfill"


@pytest.mark.parametrize(
    ("direct", "fct", "backfilled", "on_incompatible", "limit", "action"),
    [
        # compatible: the stored gallery's NFR is gated
        (made(0.7, 0.6, nfr=0.02), None, None, "refuse", 0.05, "compatible"),
        (made(0.7, 0.6, nfr=0.05), None, None, "refuse", 0.05, "compatible"),  # at the limit
        (made(0.7, 0.6, nfr=0.08), None, None, "refuse", 0.05, "refuse"),
        (made(0.7, 0.6, nfr=0.08), None, None, "refuse", None, "compatible"),  # no gate
        # transform: h(gallery)'s NFR, not the stored gallery's
        (made(0.1, 0.6, nfr=0.5), made(0.7, 0.6, nfr=0.01), None, "refuse", 0.05, "transform"),
        (made(0.1, 0.6, nfr=0.0), made(0.7, 0.6, nfr=0.09), None, "refuse", 0.05, "refuse"),
        # backfill: the re-extracted gallery's (new/new) NFR
        (made(0.5, 0.6, nfr=0.3, backfill_nfr=0.01), None, None, "backfill", 0.05, "backfill"),
        (made(0.5, 0.6, nfr=0.0, backfill_nfr=0.06), None, None, "backfill", 0.05, "refuse"),
        # partial backfill: the partially backfilled gallery's NFR
        (made(0.1, 0.6), made(0.5, 0.6, nfr=0.2), made(0.7, 0.6, nfr=0.03), PB, 0.05, PB),
        (made(0.1, 0.6), made(0.5, 0.6, nfr=0.0), made(0.7, 0.6, nfr=0.07), PB, 0.05, "refuse"),
        # a gate on an NFR that was not measured refuses
        (made(0.7, 0.6, nfr=None), None, None, "refuse", 0.05, "refuse"),
    ],
)
def test_the_policy_refuses_an_upgrade_above_its_maximum_nfr(
    direct, fct, backfilled, on_incompatible, limit, action
):
    policy = PolicySpec(on_incompatible, max_negative_flip_rate=limit)
    decision = decide(direct, fct, policy, None, backfilled)
    assert decision.action == action, decision.reason
    if action == "refuse":
        assert "policy.max_negative_flip_rate = 5.00%" in decision.reason
        assert ("NFR = " in decision.reason) != ("not measured" in decision.reason)
    elif limit is not None:
        assert "<= 5.00%" in decision.reason


def test_the_refusal_names_the_nfr_and_the_limit():
    policy = PolicySpec(max_negative_flip_rate=0.05)
    reason = decide(made(0.7, 0.6, nfr=0.0825), None, policy).reason
    assert reason.startswith("backward compatible: M(new, m1) = 70.00% > M(m1, m1) = 60.00%")
    assert reason.endswith(
        "but NFR = 8.25% > policy.max_negative_flip_rate = 5.00%: nothing is published"
    )


def test_an_unset_gate_keeps_the_existing_decisions_and_digests():
    import hashlib

    from raycompat.config import to_dict
    from raycompat.io.credentials import redact

    cfg = UpgradeConfig()
    assert cfg.policy.max_negative_flip_rate is None
    spec = cfg.upgrades[1]
    training = to_dict(cfg.training)
    training.pop("run")
    training.pop("stop")  # nor the stopping rule (training.stop), at its default
    del training["data"]["decode_actors"]  # nor the Ray Data decode actors, unset
    policy = to_dict(cfg.policy)
    del policy["max_negative_flip_rate"]
    entry = {k: v for k, v in to_dict(spec).items() if k != "map"}  # nor entries' query maps
    before = {  # the digest as written before the gate and the stopping rule existed
        "entry": entry,
        "training": redact(training),
        "policy": policy,
        "gallery_images": redact(to_dict(cfg.gallery_images)),
        "against": "m1",
    }
    text = json.dumps(before, sort_keys=True, default=str).encode()
    assert decision_digest(cfg, spec, "m1") == hashlib.sha256(text).hexdigest()
    gated = load_config(UpgradeConfig, None, ["policy.max_negative_flip_rate=0.05"])
    assert gated.policy.max_negative_flip_rate == 0.05
    assert decision_digest(gated, spec, "m1") != decision_digest(cfg, spec, "m1")
    mapped = load_config(UpgradeConfig, None, ["upgrades.1.method=procrustes"])
    overrides = ["upgrades.1.method=procrustes", "upgrades.1.map.pairs=100"]
    other = load_config(UpgradeConfig, None, overrides)
    assert decision_digest(mapped, mapped.upgrades[1], "m1") != decision_digest(
        other, other.upgrades[1], "m1"
    )  # a map entry's fit is part of what it is judged under


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_the_gate_is_a_fraction(value):
    from raycompat.errors import ConfigError

    with pytest.raises(ConfigError, match=r"policy.max_negative_flip_rate must be"):
        load_config(UpgradeConfig, None, [f"policy.max_negative_flip_rate={value}"])


# ---- the report: one number per quantity ---------------------------------------------------


def hand_report() -> Report:
    data = identification()
    old_hits = data.hits(OLD, OLD)
    direct = evidence(data, NEW, OLD, data.score(OLD, OLD), "m1", old_hits=old_hits)
    stored = evidence(data, NEW, NEW, 0.5, "m1", old_hits=old_hits, stored="v3")
    outcomes = [
        Outcome("m1", "independent", 3, "initial", "first"),
        Outcome("m2", "cores", 5, "refuse", "ECC fails", "m1", None, {"direct": direct.as_dict()}),
        Outcome("m3", "cores", 7, "compatible", "ok", "m1", "v3", {"direct": stored.as_dict()}),
    ]
    features = {"m1": OLD, "m2": NEW, "m3": NEW}
    matrix = history_matrix(["m1", "m2", "m3"], features, data)
    return Report("toy", "identification", matrix, outcomes, [])


def test_the_report_shows_each_cell_once_and_the_flips_in_percent(tmp_path):
    report = hand_report()
    write_report(tmp_path, report, {"name": "toy"})
    text = (tmp_path / "report.md").read_text()
    # the matrix and the decision's table: M(m1, m1) = 75.00 both, M(m2, m1) = 75.00 both
    assert "| m1 | 75.00 |  |  |" in text and "| m2 | 75.00 ✗ | 75.00 |  |" in text
    row = "| m2 (cores), stored gallery | 75.00 | 75.00 | 75.00 | **no** | - | 25.00 (33.33) |"
    assert row + " 25.00 (33.33) |" in text
    # decision rows: NFR of the gallery served (a refusal: the one it was judged on)
    assert "| m2 | cores | 5 | **refuse** | - | 25.00 (33.33) | ECC fails |" in text
    assert "| m1 | independent | 3 | **initial** | v1 | - | first |" not in text  # no "v1"
    assert "| m1 | independent | 3 | **initial** | - | - | first |" in text
    # a stored version that is not the gallery model's features says so
    assert "| m3 (cores), stored gallery v3 (not m1's own features) | 50.00 |" in text
    assert "NFR (of old hits)" in text


def test_the_summary_leaves_unmeasured_cells_null_and_carries_the_flips(tmp_path):
    report = hand_report()
    summary = report.summary()
    assert summary["unit"] == "fraction"
    assert summary["matrix"] == [[0.75, None, None], [0.75, 0.75, None], [0.75, 0.75, 0.75]]
    assert summary["negative_flips"]["m2"] == {
        "negative_flip_rate": 0.25,
        "negative_flip_rate_of_old_hits": pytest.approx(1 / 3),
    }
    assert "m1" not in summary["negative_flips"]  # the initial model has no old system
    write_report(tmp_path, report, {"name": "toy"})
    body = json.loads((tmp_path / "report.json").read_text())  # null is valid JSON
    assert body["matrix"][0] == [0.75, None, None]


def test_a_partial_backfill_decision_shows_the_backfilled_galleries_flips():
    data = identification()
    old_hits = data.hits(OLD, OLD)
    proof = {
        "direct": evidence(data, NEW, OLD, 0.75, "m1", old_hits=old_hits).as_dict(),
        "transformed": evidence(data, NEW, OLD, 0.75, "m1", True, old_hits).as_dict(),
        "backfilled": evidence(data, NEW, NEW, 0.75, "m1", True, old_hits).as_dict(),
    }
    backfill = {"budget": 0.3, "order": "uncertainty"}
    outcome = Outcome("m3", "fct", 7, "partial_backfill", "asked", "m1", "v3", proof)
    outcome.backfill = backfill
    matrix = CompatibilityMatrix.from_array(np.array([[0.75, 0], [0.75, 0.75]]), ["m1", "m3"])
    from raycompat.upgrade.report import _evidence_rows, served_flips

    assert served_flips(outcome) == (0.25, pytest.approx(1 / 3))  # new/new: n1 flips
    rows = _evidence_rows(outcome)
    assert rows[-1].startswith(
        "| m3 (fct), h(gallery) partially backfilled (30%, uncertainty order), test images |"
    )
    assert len(Report("toy", "identification", matrix, [outcome], []).summary()["names"]) == 2


# ---- the job: the decision and the matrix score the same arrays -----------------------------


def test_the_reference_uses_the_features_in_memory_for_their_own_stored_rows(tmp_path):
    from raycompat.cluster.upgrade.job import Upgrader
    from raycompat.store import GalleryStore, VersionInfo, embedding_table
    from raycompat.store.catalog.models import Catalog
    from raycompat.upgrade.evaluate import Parent

    def version(name, rows):
        staging = store.begin("mnist", VersionInfo(name, "m1", 2, True, f"{name} = x"))
        staging.write_table(embedding_table(np.arange(4), rows), "part-0.parquet")
        return staging.commit()

    store = GalleryStore(str(tmp_path / "store"))
    own = version("v1", OLD / np.linalg.norm(OLD, axis=1, keepdims=True))  # stored normalised
    other = version("v2", NEW)
    cfg = load_config(UpgradeConfig, None, [f"work_dir={tmp_path}/work"])
    upgrader = Upgrader(cfg, store, Catalog(store), identification())
    upgrader.features.add("m1", OLD)
    parent = Parent("m1", str(tmp_path / "m1"), 3)
    reference = upgrader._reference(parent, own)
    assert reference.gallery is OLD and reference.stored == ""
    matrix = history_matrix(["m1"], upgrader.features, upgrader.data)
    assert reference.old_self == matrix.as_array()[0, 0] == 0.75
    # Another version (e.g. a transformed one): its rows. Old queries at 0, 20, 90, 50 against
    # rows at 5, 40, 70, 85: q0 -> 40, q1 -> 5, q2 -> 85 hit; q3 (50) -> 40 (img 1) misses.
    reference = upgrader._reference(parent, other)
    assert reference.stored == "v2" and reference.old_self == 0.75
    assert reference.old_hits.hit.tolist() == [True, True, True, False]
    np.testing.assert_allclose(reference.gallery, NEW)
    assert upgrader.features["m1"] is OLD  # the matrix row was not replaced


@pytest.mark.parametrize(
    ("adapted", "on_incompatible", "limit", "action"),
    [
        (made(0.7, 0.6, nfr=0.01), "refuse", None, "adapt"),
        (made(0.7, 0.6, nfr=0.09), "refuse", 0.05, "refuse"),  # the flip gate on the map's NFR
        (made(0.5, 0.6), "refuse", None, "refuse"),
        (made(0.5, 0.6, backfill_nfr=0.0), "backfill", None, "backfill"),
        (made(0.5, 0.6), "partial_backfill", None, "refuse"),  # needs FCT's h
    ],
)
def test_an_upgrade_through_a_query_map_is_decided_on_the_mapped_queries(
    adapted, on_incompatible, limit, action
):
    """``decide_adapted`` (procrustes, affine, adapter entries): ECC and the flip gate on the
    candidate's mapped queries against the stored gallery; published as ``adapt``."""
    from raycompat.upgrade.policy import SERVED, decide_adapted

    policy = PolicySpec(on_incompatible, max_negative_flip_rate=limit)
    decision = decide_adapted(adapted, policy, "procrustes")
    assert decision.action == action, decision.reason
    if action == "adapt":
        assert decision.reason.startswith("through its procrustes query map: M(new, m1) = 70.00%")
        assert SERVED["adapt"] == ("adapted", "negative_flip_rate")


@pytest.mark.parametrize(
    ("direct", "mapped", "on_incompatible", "action"),
    [
        (made(0.1, 0.6), made(0.7, 0.6), "refuse", "transform"),
        (made(0.1, 0.6), made(0.5, 0.6), "refuse", "refuse"),
        (made(0.1, 0.6), made(0.5, 0.6), "backfill", "backfill"),
        (
            made(0.1, 0.6),
            made(0.5, 0.6),
            "partial_backfill",
            "refuse",
        ),  # no uncertainty to order by
    ],
)
def test_a_map_of_the_gallery_is_decided_as_h_without_a_partial_backfill(
    direct, mapped, on_incompatible, action
):
    """``map.direction: gallery``: the fitted map is h (``decide``'s transform row), but a
    partial backfill needs FastFill's uncertainty, which a fitted map lacks."""
    from raycompat.upgrade.policy import gallery_map_decision

    decision = gallery_map_decision(decide(direct, mapped, PolicySpec(on_incompatible)), "affine")
    assert decision.action == action, decision.reason
    if on_incompatible == "partial_backfill":
        assert decision.reason.endswith("a fitted affine map does not learn: nothing is published")


def test_the_reference_scores_a_candidate_as_its_collectors_say():
    """``Reference`` (raycompat/upgrade/evaluate.py, Ray-free): a baseline is the direct
    evidence, a query map of the identity is the direct evidence, a full partial backfill is
    the new model's own gallery; the proof carries what was measured, with the fits."""
    import torch

    from raycompat.upgrade.evaluate import Parent, Reference

    data = identification()
    reference = Reference.of(data, Parent("m1", "", 2), OLD, None, "v1")
    assert reference.gallery is OLD and reference.old_self == 0.75 and reference.stored == ""
    found = reference.judge(NEW)
    assert found.direct == evidence(data, NEW, OLD, 0.75, "m1", old_hits=reference.old_hits)
    assert reference.baseline("ift", NEW) == {"ift": found.direct.as_dict()}
    assert reference.mapped_queries(torch.nn.Identity(), NEW) == found.direct
    spec = PartialBackfillSpec(budget=1.0, order="random")
    backfilled, curves = reference.partial_backfill(NEW, OLD, np.zeros(4), spec, seed=0)
    assert backfilled.cross == backfilled.new_self == data.score(NEW, NEW) and curves
    found.adapted, found.adapted_fit = found.direct, {"kind": "procrustes", "pairs": 9}
    assert list(found.proof()) == ["direct", "adapted"]
    assert found.proof()["adapted"]["pairs"] == 9 and found.seen_classes is None
