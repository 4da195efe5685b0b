"""The upgrade job's pure pieces: decision, evaluation, stored-row lookup, report, config."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from raycompat.cluster.upgrade.steps import gallery_before, rows_of
from raycompat.config import load_config, to_dict
from raycompat.config.upgrade import PolicySpec, UpgradeConfig, check_upgrade_config
from raycompat.errors import ConfigError, StoreError, UnsafePathError
from raycompat.evaluation import EvalSet
from raycompat.metrics.compatibility import CompatibilityMatrix
from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog, ModelRecord
from raycompat.upgrade.evaluate import EvalData, evidence, history_matrix
from raycompat.upgrade.policy import decide
from raycompat.upgrade.report import Outcome, Report, compatible_cells, write_report

CONFIGS = __import__("pathlib").Path(__file__).parents[2] / "configs"


def ev(cross, old_self, new_self=0.9, against="m1"):
    data = EvalData(None, np.zeros(0), EvalSet(np.zeros(0)), "identification", "cosine", True, 8)
    data.score = lambda q, g: {("n", "g"): cross, ("n", "n"): new_self}[(q, g)]
    return evidence(data, "n", "g", old_self, against)


def test_evidence_ecc_and_update_gain_by_hand():
    e = ev(cross=0.7, old_self=0.6, new_self=0.8)
    assert e.ecc and e.update_gain == pytest.approx((0.7 - 0.6) / (0.8 - 0.6))
    tie = ev(cross=0.6, old_self=0.6)
    assert not tie.ecc  # strict: equal is not compatible
    assert ev(cross=0.5, old_self=0.6, new_self=0.6).update_gain is None  # undefined


@pytest.mark.parametrize(
    ("direct", "fct", "policy", "action"),
    [
        ((0.7, 0.6), None, "refuse", "compatible"),
        ((0.5, 0.6), None, "refuse", "refuse"),
        ((0.5, 0.6), None, "backfill", "backfill"),
        ((0.1, 0.6), (0.7, 0.6), "refuse", "transform"),
        ((0.7, 0.6), (0.5, 0.6), "refuse", "refuse"),  # FCT never falls back to compatible
        ((0.7, 0.6), (0.5, 0.6), "backfill", "backfill"),
    ],
)
def test_decision_table(direct, fct, policy, action):
    decision = decide(ev(*direct), ev(*fct) if fct else None, PolicySpec(policy))
    assert decision.action == action
    assert ("ECC holds" in decision.reason) == (action == "transform")
    if action in ("refuse", "backfill"):
        assert "ECC fails" in decision.reason


def test_history_matrix_equals_naive_top1():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 5)
    centres = rng.normal(size=(4, 3))
    feats = {
        "a": centres[labels] + 0.3 * rng.normal(size=(20, 3)),
        "b": rng.normal(size=(20, 3)),
    }
    data = EvalData(None, np.arange(20), EvalSet(labels), "identification", "cosine", True, 8)
    matrix = history_matrix(["a", "b"], feats, data)

    def naive(q, g):
        qn = q / np.linalg.norm(q, axis=1, keepdims=True)
        gn = g / np.linalg.norm(g, axis=1, keepdims=True)
        sims = qn @ gn.T
        np.fill_diagonal(sims, -np.inf)
        return float(np.mean(labels[sims.argmax(1)] == labels))

    expected = [
        [naive(feats["a"], feats["a"])],
        [naive(feats["b"], feats["a"]), naive(feats["b"], feats["b"])],
    ]
    assert matrix.names == ["a", "b"]
    np.testing.assert_allclose(matrix.as_array()[0, :1], expected[0])
    np.testing.assert_allclose(matrix.as_array()[1, :2], expected[1])


def _write(path, ids, vectors):
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(np.asarray(vectors, np.float32).ravel()), 2
            ),
        }
    )
    pq.write_table(table, path)
    return str(path)


def test_rows_of_returns_requested_order_or_none(tmp_path):
    fs = pafs.LocalFileSystem()
    a = _write(tmp_path / "a.parquet", [5, 1], [[5, 5], [1, 1]])
    b = _write(tmp_path / "b.parquet", [3, 9], [[3, 3], [9, 9]])
    got = rows_of(fs, [a, b], np.array([9, 1, 3]), "test")
    np.testing.assert_array_equal(got, [[9, 9], [1, 1], [3, 3]])
    # Whatever order the parts come in (Ray's), the rows come in the ids' order.
    np.testing.assert_array_equal(rows_of(fs, [b, a], np.array([9, 1, 3]), "test"), got)
    assert rows_of(fs, [a, b], np.array([1, 2]), "test") is None  # id 2 is not stored


@pytest.mark.ray
def test_rows_of_scans_parts_in_ray_tasks(tmp_path, ray_local):
    """The upgrade's quality gate on the cluster: one task per part, only matches returned."""
    fs = pafs.LocalFileSystem()
    a = _write(tmp_path / "a.parquet", [5, 1], [[5, 5], [1, 1]])
    b = _write(tmp_path / "b.parquet", [3, 9], [[3, 3], [9, 9]])
    got = rows_of(fs, [a, b], np.array([9, 1, 3]), "test")
    np.testing.assert_array_equal(got, [[9, 9], [1, 1], [3, 3]])
    assert rows_of(fs, [a, b], np.array([1, 2]), "test") is None


def test_compatible_cells_and_report_files(tmp_path):
    matrix = CompatibilityMatrix.from_array(
        np.array([[0.6, 0, 0], [0.7, 0.8, 0], [0.5, 0.9, 0.95]]), names=["m1", "m2", "m3"]
    )
    ok = compatible_cells(matrix.as_array())
    assert ok.tolist() == [[True] * 3, [True, True, True], [False, True, True]]
    outcome = Outcome(
        "m2",
        "cores",
        7,
        "compatible",
        "because",
        "m1",
        "v1",
        {"direct": ev(0.7, 0.6).as_dict()},
        {"ift": ev(0.3, 0.6).as_dict()},
        {"train": 1.5},
    )
    report = Report(
        "toy",
        "identification",
        matrix,
        [outcome],
        [
            {
                "version": "v1",
                "model_version": "m1",
                "rows": 10,
                "lineage": "v1 = extract(m1)",
                "queried_by": ["m1", "m2"],
            }
        ],
    )
    labels = np.repeat(np.arange(3), 4)
    options = {"key": "AKIAREPORTTEST", "secret": "s3cr3t/report", "anon": False}
    files = write_report(
        tmp_path,
        report,
        {"name": "toy", "store": {"storage_options": options}},
        {"m2": (np.random.default_rng(0).normal(size=(12, 2)), labels)},
    )
    for name in files.values():
        assert (tmp_path / name).stat().st_size > 0
    # The merged config is written redacted; the text files are private (they name paths).
    config = (tmp_path / "config.yaml").read_text()
    assert "AKIAREPORTTEST" not in config and "s3cr3t" not in config
    assert "key: <redacted>" in config and "anon: false" in config
    for name in ("config.yaml", "report.json", "report.md", "matrix.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
    text = (tmp_path / "report.md").read_text()
    assert "| m3 | 50.00 ✗ | 90.00 | 95.00 |" in text
    assert "| baseline: ift | 60.00 | 30.00 | 90.00 | **no** |" in text
    body = json.loads((tmp_path / "report.json").read_text())
    assert body["decisions"] == {"m2": "compatible"}
    assert body["AC"] == pytest.approx(2 / 3)


def test_embedded_default_matches_configs_upgrade_mnist():
    assert to_dict(load_config(UpgradeConfig, CONFIGS / "upgrade_mnist.yaml")) == to_dict(
        UpgradeConfig()
    )


def test_partial_section_keeps_the_parent_defaults():
    cfg = load_config(UpgradeConfig, None, ["training.epochs=1"])
    assert cfg.training.epochs == 1
    assert cfg.training.optim.name == "adam" and cfg.training.run.storage_path.startswith(
        "outputs/upgrade"
    )


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (
            ["upgrades=[{model_version: m1, classes: 4, method: nope}]"],
            ConfigError,
            "upgrades[0].method: unknown compatibility method 'nope'",
        ),
        (
            ["upgrades=[{model_version: m1, classes: 4, baselines: [independent, nope]}]"],
            ConfigError,
            "upgrades[0].baselines[1]: unknown compatibility method 'nope'",
        ),
        (
            ["upgrades=[{model_version: a, classes: 4}, {model_version: a, classes: 5}]"],
            ConfigError,
            "appears twice",
        ),
        (["upgrades=[{model_version: ../x, classes: 4}]"], UnsafePathError, "../x"),
        (["upgrades=[{model_version: m1, classes: 11}]"], ConfigError, "classes=11"),
        (["upgrades=[{model_version: m1, classes: 4, colour: red}]"], ConfigError, "colour"),
        (["upgrades=[]"], ConfigError, "history is empty"),
        (["store.gallery="], ConfigError, "store.gallery"),
        (
            ["upgrades=[{model_version: m1, classes: 4, method: bct, method_options: {lamb: 1}}]"],
            ValueError,
            "lamb",
        ),
    ],
)
def test_bad_upgrade_configs_are_clear_errors(overrides, error, message):
    with pytest.raises(error, match=__import__("re").escape(message)):
        check_upgrade_config(load_config(UpgradeConfig, None, overrides))


def test_model_files_round_trip_through_the_store(tmp_path):
    source = tmp_path / "model"
    source.mkdir()
    (source / "model.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"abc")
    catalog = Catalog(GalleryStore(str(tmp_path / "store")))
    uri = catalog.put_model_files("m1", str(source))
    catalog.register_model(ModelRecord("m1", uri, 4))
    out = catalog.fetch_model_files("m1", str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == b"abc"
    assert catalog.models()[0].uri == "_models/m1" and out.endswith("copy")  # root-relative
    assert catalog.model_uri("m1") == uri
    with pytest.raises(StoreError, match="'m9' is not registered"):
        catalog.fetch_model_files("m9", str(tmp_path / "x"))


def test_cli_report_shows_a_run_and_names_a_missing_one(tmp_path, capsys):
    from raycompat.cli.app import main

    (tmp_path / "report.md").write_text("# Upgrade report: toy\n")
    (tmp_path / "report.json").write_text(json.dumps({"decisions": {"m1": "initial"}}))
    assert main(["report", str(tmp_path)]) == 0
    assert "# Upgrade report: toy" in capsys.readouterr().out
    assert main(["report", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decisions"] == {"m1": "initial"}
    assert main(["report", str(tmp_path / "nope")]) == 1
    assert "nope/report.md does not exist" in capsys.readouterr().err


def test_history_from_training_scenarios():
    from raycompat.config.train import TrainConfig
    from raycompat.config.upgrade import history_from_training

    cores = load_config(TrainConfig, CONFIGS / "train_mnist_cores.yaml")
    assert [
        (u.model_version, u.classes, u.method) for u in history_from_training(cores, "x").upgrades
    ] == [("m1", 4, "independent"), ("m2", 7, "cores"), ("m3", 10, "cores")]
    cl2r = load_config(TrainConfig, CONFIGS / "train_mnist_cl2r.yaml")
    history = history_from_training(cl2r, "best")
    assert [u.classes for u in history.upgrades] == [4, 6, 8, 10]
    assert history.upgrades[2].method_options == {"lam": 0.1, "rho": 5.0}
    assert history.training.optim == cl2r.optim and history.name == "best"
    check_upgrade_config(history)
    celeba = load_config(TrainConfig, CONFIGS / "train_celeba_iam_cl2r.yaml")
    with pytest.raises(ConfigError, match="replacements"):
        history_from_training(celeba, "x")


def _exported_model(directory):
    import torch

    from raycompat.config.train import ModelSpec
    from raycompat.train.export import build_model, export_model

    torch.manual_seed(0)
    spec = ModelSpec(backbone="lenetpp", head="dsimplex", num_classes=10)
    export_model(directory, build_model(spec).state_dict(), spec, label_map={"0": 0})
    return str(directory)


@pytest.mark.parametrize("action", ["compatible", "refuse"])
def test_compatible_action_grants_the_current_version_without_a_rewrite(tmp_path, action):
    from raycompat.cluster.upgrade.job import Upgrader
    from raycompat.store import VersionInfo, embedding_table
    from raycompat.upgrade.policy import Decision

    store = GalleryStore(str(tmp_path / "store"))
    catalog = Catalog(store)
    info = VersionInfo("v1", "m1", 9, False, "v1 = extract(m1)")
    staging = store.begin("mnist", info)
    staging.write_table(
        embedding_table(np.arange(4), np.ones((4, 9), np.float32)), "part-0.parquet"
    )
    v1 = staging.commit()
    old = _exported_model(tmp_path / "m1")
    from raycompat.cluster.upgrade.steps import publish_model
    from raycompat.store.catalog.models import QueryGrant

    publish_model(
        catalog, ModelRecord("m1", "", 9), old, QueryGrant("mnist", "v1", "m1", "extracted")
    )
    cfg = UpgradeConfig()
    upgrader = Upgrader(cfg, store, catalog, data=None)
    new = _exported_model(tmp_path / "m2")
    (tmp_path / "m2" / "test_features.npy").write_bytes(b"not a model file")  # stays behind

    def act(reason):
        return upgrader.publisher.act(
            1,
            cfg.upgrades[1],
            Decision(action, reason),
            new,
            np.zeros((4, 9), np.float32),
            v1,
            None,
            0.5,
            {"direct": {"ecc": True}},
            "m1",
        )

    decision, version = act("because")
    assert [v.version for v in store.versions("mnist")] == ["v1"]  # never a rewrite
    if action == "refuse":
        assert version is None and [m.model_version for m in catalog.models()] == ["m1"]
        return
    grant = catalog.queryable_version("mnist", "m2")
    assert version == "v1" and grant.relation == "compatible" and grant.gallery_version == "v1"
    assert catalog.model("m2").parent == "m1" and grant.evidence["reason"] == "because"
    assert sorted(p.name for p in (tmp_path / "store" / "_models" / "m2").iterdir()) == [
        "model.json",
        "model.safetensors",
    ]
    # The same upgrade again is a no-op; another decision for the same model is refused.
    act("because")
    with pytest.raises(StoreError, match="different content"):
        act("other reason")


def test_an_adapt_action_stores_the_map_and_grants_the_current_version_through_it(tmp_path):
    """``adapt`` (procrustes, affine, adapter entries): no rewrite; the fitted map is stored
    beside v1 and m2's grant (``adapted``) names it, with the job's evidence (issue 41, 4)."""
    import torch

    from raycompat.cluster.upgrade.job import Upgrader
    from raycompat.cluster.upgrade.steps import publish_model
    from raycompat.serving.query_adapters import load_adapter
    from raycompat.store import VersionInfo, embedding_table
    from raycompat.store.catalog.models import QueryGrant
    from raycompat.transformations import PairStatistics, fit_procrustes
    from raycompat.upgrade.policy import Decision

    store = GalleryStore(str(tmp_path / "store"))
    catalog = Catalog(store)
    staging = store.begin("mnist", VersionInfo("v1", "m1", 9, False, "v1 = extract(m1)"))
    staging.write_table(embedding_table(np.arange(4), np.ones((4, 9), np.float32)), "p.parquet")
    v1 = staging.commit()
    old = _exported_model(tmp_path / "m1")
    grant = QueryGrant("mnist", "v1", "m1", "extracted")
    publish_model(catalog, ModelRecord("m1", "", 9), old, grant)
    cfg = UpgradeConfig()
    upgrader = Upgrader(cfg, store, catalog, data=None)
    x = np.random.default_rng(0).standard_normal((50, 9)).astype(np.float32)
    fit = fit_procrustes(PairStatistics.of(x, x[:, ::-1].copy()))
    fields = (np.zeros((4, 9), np.float32), v1, None, 0.5, {"adapted": {"ecc": True}}, "m1", fit)
    new = _exported_model(tmp_path / "m2")
    decision, version = upgrader.publisher.act(1, cfg.upgrades[1], Decision("adapt", "why"),
                                               new, *fields)  # fmt: skip
    assert (decision.action, version) == ("adapt", "v1")
    assert [v.version for v in store.versions("mnist")] == ["v1"]  # never a rewrite
    granted = catalog.queryable_version("mnist", "m2")
    assert (granted.relation, granted.evidence["reason"]) == ("adapted", "why")
    assert granted.evidence["kind"] == "procrustes" and granted.evidence["pairs"] == 50
    queries = load_adapter(store, granted)(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(queries, x[:, ::-1], atol=1e-5)  # the map the grant names


def test_evidence_on_the_gallery_models_classes_is_the_subset_score():
    from raycompat.upgrade.evaluate import evidence_on_classes

    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(4), 6)
    data = EvalData(
        None,
        np.arange(24),
        EvalSet(labels),
        "identification",
        "cosine",
        True,
        8,
        labels_are_classes=True,
    )
    new, gallery, old = (rng.normal(size=(24, 3)) for _ in range(3))
    got = evidence_on_classes(data, 2, new, gallery, old, "m1")
    keep = labels < 2
    sub = EvalData(None, np.arange(12), EvalSet(labels[keep]), "identification", "cosine", True, 8)
    assert got.cross == sub.score(new[keep], gallery[keep])
    assert got.old_self == sub.score(old[keep], gallery[keep])
    assert got.new_self == sub.score(new[keep], new[keep])
    assert evidence_on_classes(data, 4, new, gallery, old, "m1") is None  # not a subset
    data.labels_are_classes = False  # e.g. LFW as eval.dataset: its labels are not classes
    assert evidence_on_classes(data, 2, new, gallery, old, "m1") is None


@pytest.mark.parametrize(
    ("parent", "relation", "action"),
    [
        (None, "extracted", "initial"),
        ("m1", "extracted", "backfill"),
        ("m1", "compatible", "compatible"),
        ("m1", "transformed", "transform"),
    ],
)
def test_a_published_model_is_reported_with_its_own_action_on_rerun(
    tmp_path, parent, relation, action
):
    from raycompat.cluster.upgrade.job import Upgrader
    from raycompat.store import VersionInfo, embedding_table
    from raycompat.store.catalog.models import QueryGrant

    store = GalleryStore(str(tmp_path / "store"))
    catalog = Catalog(store)
    staging = store.begin("mnist", VersionInfo("v1", "m2", 9, False, "v1 = extract(m2)"))
    staging.write_table(
        embedding_table(np.arange(4), np.ones((4, 9), np.float32)), "part-0.parquet"
    )
    staging.commit()
    if parent:
        catalog.register_model(ModelRecord(parent, "", 9))
    catalog.register_model(ModelRecord("m2", "", 9, parent=parent))
    grant = catalog.grant(QueryGrant("mnist", "v1", "m2", relation, {"reason": "why"}))
    cfg = load_config(UpgradeConfig, None, [f"work_dir={tmp_path}/work"])
    upgrader = Upgrader(cfg, store, catalog, data=None)
    cache = tmp_path / "work" / cfg.name / "features"
    cache.mkdir(parents=True)
    np.save(cache / "m2.npy", np.zeros((3, 9), np.float32))  # no model files needed
    outcome = upgrader._resumed(cfg.upgrades[1], grant)
    assert (outcome.action, outcome.resumed, outcome.reason) == (action, True, "why")
    assert outcome.gallery_version == "v1" and outcome.against == parent


def test_a_rerun_judges_each_entry_against_the_gallery_at_its_position():
    from types import SimpleNamespace as V

    upgrades = load_config(UpgradeConfig, None, []).upgrades  # m1, m2, m3
    names = [u.model_version for u in upgrades]
    assert names[:3] == ["m1", "m2", "m3"]
    # after a first run: m1 started the gallery, m2 was refused, m3 transformed it
    versions = [V(version="v1", model_version="m1"), V(version="v3", model_version="m3")]
    assert gallery_before(versions, upgrades, 0) is None
    assert gallery_before(versions, upgrades, 1).version == "v1"  # not m3's v3
    assert gallery_before(versions, upgrades, 2).version == "v1"
    # a version of a model outside the history (an adopted table) counts as earlier
    adopted = [V(version="v1", model_version="prod"), *versions[:1]]
    assert gallery_before(adopted[:1], upgrades, 0).version == "v1"
    assert gallery_before(adopted, upgrades, 1).model_version == "m1"
