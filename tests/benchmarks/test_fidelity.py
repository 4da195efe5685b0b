"""benchmarks/fidelity.py: every metric against a hand-worked value or a naive reference, and
the ``--quick`` run's output (structure, every metric computed, a cell recomputed from the saved
features)."""

from __future__ import annotations

import importlib
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    return {
        name: importlib.import_module(f"_fidelity_{name}") for name in ("eval", "report", "train")
    } | {"main": importlib.import_module("fidelity")}


def naive_hits(query, gallery, labels):
    """Per query i: is the most cosine-similar gallery row j != i of the same label?"""
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    hits = []
    for i in range(len(q)):
        best = max((j for j in range(len(g)) if j != i), key=lambda j: q[i] @ g[j])
        hits.append(labels[best] == labels[i])
    return np.array(hits)


def test_matrix_ecc_ac_aa_gain_and_flips_by_hand(bench):
    """Four images, two models in 2-D, worked out by hand (see the comments)."""
    ev = bench["eval"]
    labels = np.array([0, 0, 1, 1])
    q0 = np.array([[1, 0], [1, 0.1], [0, 1], [-1, 0]], dtype=np.float32)
    q1 = np.array([[1, 0], [1, 0.1], [0, 1], [0.1, 1]], dtype=np.float32)
    served = ev.Served([q0, q1], {(0, 0): q0, (1, 0): q0, (1, 1): q1}, labels)
    out = ev.run_metrics(served, upper_self_tests=[0.5, 0.875])
    # M(0,0): image 2's nearest is image 1 (label 0): 3/4. M(1,1): all right. M(1,0): new query
    # 2 = (0,1) is nearest to old row 1 = (1,0.1) (label 0), the others right: 3/4.
    assert out["matrix"] == [[75.0, None], [75.0, 100.0]]
    assert out["ecc"] == [[None, None], [False, None]]  # 75 > 75 fails (strict)
    assert out["AC"] == 0.0 and out["ecc_all"] is False
    assert out["AA"] == pytest.approx(250 / 3)
    upgrade = out["upgrades"][0]
    assert upgrade["update_gain"] == pytest.approx((0.75 - 0.75) / (0.875 - 0.75))
    # old hits [T, T, F, T]; served hits [T, T, F, T]; backfilled hits [T, T, T, T]
    assert upgrade["served"] == {
        "nfr": 0.0,
        "pfr": 0.0,
        "nfr_of_old_correct": 0.0,
        "relative_nfr": 0.0,
    }
    # the new system is always right: no flip is possible, Yan's ratio is 0/0
    assert upgrade["backfilled"] == {
        "nfr": 0.0,
        "pfr": 25.0,
        "nfr_of_old_correct": 0.0,
        "relative_nfr": None,
    }
    assert out["upgrade_mean"] == upgrade


def test_run_metrics_match_a_naive_reference(bench):
    ev = bench["eval"]
    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(6), 4)
    queries = [rng.standard_normal((24, 5)).astype(np.float32) + i for i in range(3)]
    galleries = {(t, k): queries[k] for t in range(3) for k in range(t + 1)}
    galleries[2, 0] = rng.standard_normal((24, 5)).astype(np.float32)  # a transformed gallery
    upper = [0.3, 0.6, 0.9]
    out = ev.run_metrics(ev.Served(queries, galleries, labels), upper)
    hits = {key: naive_hits(queries[key[0]], g, labels) for key, g in galleries.items()}
    M = {key: h.mean() for key, h in hits.items()}
    for (t, k), value in M.items():
        assert out["matrix"][t][k] == pytest.approx(100 * value)
    pairs = [(t, k) for t in range(3) for k in range(t)]
    assert out["AC"] == pytest.approx(np.mean([M[t, k] > M[k, k] for t, k in pairs]))
    assert out["AA"] == pytest.approx(100 * np.mean(list(M.values())))
    for t in (1, 2):
        upgrade = out["upgrades"][t - 1]
        gain = (M[t, t - 1] - M[t - 1, t - 1]) / (upper[t] - M[t - 1, t - 1])
        assert upgrade["update_gain"] == pytest.approx(gain)
        old, new = hits[t - 1, t - 1], hits[t, t - 1]
        assert upgrade["served"]["nfr"] == pytest.approx(100 * np.mean(old & ~new))
        assert upgrade["served"]["pfr"] == pytest.approx(100 * np.mean(~old & new))
        of_old = 100 * np.sum(old & ~new) / np.sum(old)
        assert upgrade["served"]["nfr_of_old_correct"] == pytest.approx(of_old)
        relative = np.mean(old & ~new) / ((1 - new.mean()) * old.mean())
        assert upgrade["served"]["relative_nfr"] == pytest.approx(relative)


def test_re_embedding_share_by_hand(bench):
    """M(t, k) / M(t, t): what serving the old gallery keeps of a full re-embedding's score."""
    share = bench["eval"].re_embedding_share(
        [[80.0, None, None], [40.0, 50.0, None], [30.0, 20.0, 60.0]]
    )
    assert share["matrix"][1][0] == pytest.approx(80.0)
    assert share["matrix"][2] == pytest.approx([50.0, 100 / 3, None])
    assert share["matrix"][0] == [None, None, None] and share["matrix"][1][1] is None
    assert share["mean"] == pytest.approx((80 + 50 + 100 / 3) / 3)
    assert bench["eval"].re_embedding_share([[0.0, None], [10.0, 0.0]])["mean"] is None


def test_spearman_by_hand(bench):
    ev = bench["eval"]
    # no ties: d = (0, 1, 1, 0), rho = 1 - 6 * 2 / (4 * 15)
    assert ev.spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    # ties share their average rank: (1.5, 1.5, 3) against (1, 2, 3): 1.5 / sqrt(1.5 * 2)
    assert ev.spearman([5, 5, 9], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3.0))
    assert ev.spearman([1, 1, 1], [1, 2, 3]) is None
    assert ev.average_ranks([3, 1, 3, 2]).tolist() == [3.5, 1.0, 3.5, 2.0]


def test_backfill_auc_matches_a_naive_curve(bench):
    ev = bench["eval"]
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(5), 3)
    new = rng.standard_normal((15, 4)).astype(np.float32)
    moved = new + rng.standard_normal((15, 4)).astype(np.float32)
    uncertainty = rng.standard_normal(15).astype(np.float32)
    out = ev.backfill_metrics(new, moved, uncertainty, labels, random_orders=2)
    order = np.argsort(-uncertainty, kind="stable")
    fractions = np.linspace(0, 1, 11)
    top1 = []
    for f in fractions:
        gallery = moved.copy()
        first = order[: int(np.rint(f * 15))]
        gallery[first] = new[first]
        top1.append(naive_hits(new, gallery, labels).mean())
    assert out["auc_top1"]["uncertainty"] == pytest.approx(100 * np.trapezoid(top1, fractions))
    error = ev.transformation_error(moved, new)
    u = new / np.linalg.norm(new, axis=1, keepdims=True)
    m = moved / np.linalg.norm(moved, axis=1, keepdims=True)
    assert error == pytest.approx(((u - m) ** 2).sum(axis=1), rel=1e-5)
    assert out["spearman_gallery"] == pytest.approx(ev.spearman(uncertainty, error))


def test_summary_over_seeds_by_hand(bench):
    ev = bench["eval"]
    runs = [
        {"a": 1.0, "ok": True, "cell": [None, 2.0]},
        {"a": 3.0, "ok": False, "cell": [None, 4.0]},
        {"a": 2.0, "ok": True, "cell": [None, None]},
    ]
    out = ev.combine(runs, ev.summary_leaf)
    assert out["a"] == {"mean": 2.0, "sd": 1.0, "min": 1.0, "max": 3.0, "n": 3}
    assert out["ok"] == {"pass_rate": pytest.approx(2 / 3), "n": 3}
    assert out["cell"][0] is None
    assert out["cell"][1] == {
        "mean": 3.0,
        "sd": pytest.approx(math.sqrt(2)),
        "min": 2.0,
        "max": 4.0,
        "n": 2,
    }
    assert ev.summary_leaf([5.0])["sd"] is None
    assert ev.combine([{"x": 1.0}, {"x": None}, {"x": 3.0}], ev.mean_leaf) == {"x": 2.0}
    # the 95% interval of the mean: 2 ± t(0.975, 2) 1 / sqrt(3) = 2 ± 4.303 / 1.732 = 2 ± 2.484
    assert bench["report"].fmt(out["a"]) == "2.0 ± 1.0 [-0.5, 4.5]"
    assert bench["report"].fmt(out["ok"]) == "2/3"


def test_readme_cells_are_the_mean_and_its_95_interval(bench):
    """Five seeds of 8, 8, 10, 12, 12: mean 10, sd sqrt(16 / 4) = 2, and the 95% interval of
    the mean 10 ± t(0.975, 4) 2 / sqrt(5) = 10 ± 2.776 x 0.894 = 10 ± 2.483; the README's
    cells show the mean and that interval, not the sd or the min-max."""
    ev, report = bench["eval"], bench["report"]
    values = [8.0, 8.0, 10.0, 12.0, 12.0]
    runs = [
        {
            "matrix": [[v, None, None], [v, v, None], [v, v, v]],
            "ecc_all": i < 3,
            "upgrade_mean": {"served": {"nfr": v / 2}},
        }
        for i, v in enumerate(values)
    ]
    summary = ev.combine(runs, ev.summary_leaf)
    assert report.interval(summary["matrix"][0][0]) == pytest.approx((7.5167, 12.4833), abs=1e-4)
    assert report.fmt(summary["matrix"][0][0], digits=2, sd=False) == "10.00 [7.52, 12.48]"
    result = {"protocols": {"p/open_set": {"methods": {"m": {"summary": summary}}}}}
    row = report.readme_table(result, "p/open_set").splitlines()[2]
    assert row == "| m | " + "10.0 [7.5, 12.5] | " * 4 + "3/5 | 5.0 [3.8, 6.2] |"
    assert report.fmt(ev.summary_leaf([4.0]), sd=False) == "4.0"  # one seed: no interval


@pytest.mark.parametrize("steps, columns", [
    (2, "M(1,1) | M(2,1) | M(2,2)"), (4, "M(1,1) | M(2,1) | M(3,1) | M(4,1) | M(4,4)"),
])  # fmt: skip
def test_the_readme_table_has_a_column_per_later_model_whatever_the_steps(bench, steps, columns):
    ev, report = bench["eval"], bench["report"]
    matrix = [[float(10 * t + k) if k <= t else None for k in range(steps)] for t in range(steps)]
    run = {"matrix": matrix, "ecc_all": True, "upgrade_mean": {"served": {"nfr": 1.0}}}
    summary = ev.combine([run], ev.summary_leaf)
    result = {"protocols": {"p/open_set": {"methods": {"m": {"summary": summary}}}}}
    header, _, row = report.readme_table(result, "p/open_set").splitlines()
    assert header == f"| method | {columns} | ECC, all pairs | NFR % served |"
    cells = [f"{10 * t:.1f}" for t in range(steps)] + [f"{11 * (steps - 1):.1f}"]
    assert row == "| m | " + " | ".join(cells) + " | 1/1 | 1.0 |"


def test_identical_computations_train_once(bench, request):
    """``independent`` and ``fct`` (plain cross-entropy from the same seed) share their models;
    every learnable-head method shares the first one; CoReS keeps its own."""
    import torch

    train = bench["train"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only spins on a busy machine
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    data = train.TrainData(
        images=torch.rand(8, 1, 8, 8),
        labels=torch.arange(8) % 4,
        steps=(2, 4),
        num_outputs=4,
        backbone="lenetpp",
        backbone_kwargs={"image_size": 8},
        embed_dim=3,
    )
    trainer = train.SequenceTrainer(data, train.Optim(1, 4, 1e-3), seed=0)
    independent = trainer.sequence("independent")
    assert trainer.sequence("fct") == independent
    bct = trainer.sequence("bct")
    assert bct[0] is independent[0] and bct[1] is not independent[1]
    cores = trainer.sequence("cores")
    assert cores[0] is not independent[0]
    assert trainer.trained == 5


def test_a_model_trained_in_one_group_is_loaded_bit_for_bit_by_another(bench, request, tmp_path):
    """Method groups share models through a cache folder: a second trainer (another process in
    a run) loads what the first trained, and what it then trains from a loaded model equals what
    the first trainer would have trained from its own."""
    import torch

    train = bench["train"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    data = train.TrainData(
        images=torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(3)),
        labels=torch.arange(8) % 4,
        steps=(2, 3, 4),
        num_outputs=4,
        backbone="lenetpp",
        backbone_kwargs={"image_size": 8},
        embed_dim=3,
    )
    optim = train.Optim(1, 4, 1e-3)
    first = train.SequenceTrainer(data, optim, seed=0, cache=tmp_path)
    first.sequence("independent")
    alone = train.SequenceTrainer(data, optim, seed=0)  # no cache: trains everything itself
    second = train.SequenceTrainer(data, optim, seed=0, cache=tmp_path)
    lwf, lwf_alone = second.sequence("lwf"), alone.sequence("lwf")
    assert (first.trained, first.loaded) == (3, 0)
    assert (second.trained, second.loaded) == (2, 1)  # lwf's first model is independent's
    for got, want in zip(lwf, lwf_alone, strict=True):
        for (name, a), b in zip(got.state_dict().items(), want.state_dict().values(), strict=True):
            assert torch.equal(a, b), name
    assert len(list(tmp_path.glob("*.pt"))) == 5 and not list(tmp_path.glob("*.tmp"))


def test_method_groups_split_the_methods_and_refuse_unknown_names(bench):
    from raycompat.errors import ConfigError

    main = bench["main"]
    cfg = main.FidelityConfig(
        methods=["independent", "bct", "fct", "lwf", "cores"],
        method_groups=[["bct", "fct"], ["independent"]],
    )
    parts = main.groups(cfg, main.entries(cfg))
    assert [list(p) for p in parts] == [["bct", "fct"], ["independent", "lwf", "cores"]]
    assert parts[0]["fct"] == ("fct", "fct")
    default = main.groups(main.FidelityConfig(), main.entries(main.FidelityConfig()))
    assert sorted(n for p in default for n in p) == sorted(main.DEFAULT_METHODS)
    cfg.method_groups = [["bct", "bcx"]]
    with pytest.raises(ConfigError, match="method_groups: unknown \\['bcx'\\]"):
        main.groups(cfg, main.entries(cfg))


def test_synthetic_models_see_standardised_input(bench):
    """The synthetic protocol's models standardise their input by the training images' mean and
    sd (at 0.5-centred input LeNet++ stays at chance); a protocol that does not ask keeps the
    plain backbone."""
    import dataclasses

    import torch

    main, train = bench["main"], bench["train"]
    spec = main.SyntheticSpec(steps=[4, 6], test_identities=3, images_per_class=4, image_size=8)
    data = main.PROTOCOLS.get("synthetic")(spec, 0).train
    assert data.input_mean == pytest.approx(data.images.mean().item())
    assert data.input_std == pytest.approx(data.images.std().item())
    model = train.new_model("independent", 0, data)
    x = data.images[:3]
    with torch.no_grad():
        expected = model.backbone.inner.forward_features((x - data.input_mean) / data.input_std)
        assert torch.allclose(model.forward_features(x), expected)
    plain = dataclasses.replace(data, input_mean=0.0, input_std=1.0)
    assert not isinstance(
        train.new_model("independent", 0, plain).backbone, train.StandardizedInput
    )


def test_a_protocol_sets_its_own_batch_and_lr(bench):
    main = bench["main"]
    cfg = main.FidelityConfig()
    assert main.optim(cfg, "mnist5k") == bench["train"].Optim(2, 64, 2e-3)  # the demo's
    assert cfg.synthetic.lr != cfg.lr  # the global 2e-3 does not train there
    assert main.optim(cfg, "synthetic") == bench["train"].Optim(3, 64, cfg.synthetic.lr)
    cfg.synthetic.lr, cfg.synthetic.batch_size = None, 32
    assert main.optim(cfg, "synthetic") == bench["train"].Optim(3, 32, cfg.lr)


def test_unknown_method_is_refused(bench):
    from raycompat.errors import ConfigError

    cfg = bench["main"].FidelityConfig(methods=["bct", "bcx"])
    with pytest.raises(ConfigError, match="unknown 'bcx'"):
        bench["main"].entries(cfg)


@pytest.fixture(scope="module")
def quick(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("fidelity")
    result = bench["main"].main(
        [
            "--quick",
            "--out",
            str(out / "r.json"),
            "--markdown",
            str(out / "r.md"),
            "--save-features",
            str(out / "features"),
        ]
    )
    return out, result


SPLITS = {"open_set": "open-set", "closed_set": "closed-set"}


@pytest.mark.slow
def test_quick_run_structure(quick):
    out, result = quick
    assert json.loads((out / "r.json").read_text()) == json.loads(json.dumps(result))
    assert {"cpu_count", "torch", "torch_threads"} <= set(result["machine"])
    assert result["timing"]["measured_s"] > 0
    tasks = [t for ts in result["timing"]["protocols"].values() for t in ts]
    assert sorted(sorted(t["methods"]) for t in tasks) == sorted(
        [["bct", "cores"]] * 4 + [["fastfill", "fct", "fct_side", "independent"]] * 4
    )
    assert sum(t["models_loaded"] for t in tasks) >= 1  # a group reused the first group's models
    names = [f"{p}/{s}" for p in ("mnist5k", "synthetic") for s in SPLITS]
    assert sorted(result["protocols"]) == sorted(names)
    text = (out / "r.md").read_text()
    for name, protocol in result["protocols"].items():
        assert protocol["kind"] == SPLITS[name.split("/")[1]]
        assert "M(2,1)/M(2,2)" in text
        assert f"## {name}: {protocol['kind']}" in text
        methods = protocol["methods"]
        assert list(methods) == ["independent", "bct", "cores", "fct", "fct_side", "fastfill"]
        for method in methods.values():
            assert len(method["runs"]) == 2
            check_computed(method["runs"][0], len(protocol["steps"]))
            assert method["summary"]["AA"]["n"] == 2


def check_computed(run: dict, T: int) -> None:
    """Every measured cell holds a finite number, every unmeasured one None."""
    for t, k in itertools.product(range(T), range(T)):
        assert (run["matrix"][t][k] is None) == (k > t)
        assert (run["ecc"][t][k] is None) == (k >= t)
    assert math.isfinite(run["AC"]) and math.isfinite(run["AA"])
    # M(t, k) / M(t, t), derived when collected; None only where every later M(t, t) is 0
    later_zero = all(run["matrix"][t][t] == 0 for t in range(1, T))
    assert (run["kept"]["mean"] is None) == later_zero
    assert len(run["upgrades"]) == T - 1
    for upgrade in run["upgrades"]:
        assert "update_gain" in upgrade  # None only when M(up, up) == M(old, old)
        for path in ("served", "backfilled"):
            assert set(upgrade[path]) == {"nfr", "pfr", "nfr_of_old_correct", "relative_nfr"}
            assert math.isfinite(upgrade[path]["nfr"])
    for measures in run.get("backfill", []):
        for metric in ("auc_top1", "auc_mean_ap"):
            assert set(measures[metric]) == {"uncertainty", "random", "oracle"}
            assert all(math.isfinite(v) for v in measures[metric].values())
        assert {"spearman_gallery", "spearman_fit_rows"} <= set(measures)


@pytest.mark.slow
def test_quick_run_cell_recomputed_from_saved_features(quick):
    out, result = quick
    for method in ("bct", "fct_side"):
        saved = np.load(out / "features" / "synthetic" / f"open_set_seed1_{method}.npz")
        hits = naive_hits(saved["q1"], saved["g1_0"], saved["labels"])
        run = result["protocols"]["synthetic/open_set"]["methods"][method]["runs"][1]
        assert run["matrix"][1][0] == pytest.approx(100 * hits.mean())
    assert "fastfill" in result["protocols"]["mnist5k/open_set"]["methods"]
    assert (
        len(result["protocols"]["mnist5k/open_set"]["methods"]["fastfill"]["runs"][0]["backfill"])
        == 1
    )


@pytest.mark.slow
def test_a_rerun_reads_its_finished_tasks_and_refuses_another_configs(quick, bench, monkeypatch):
    """Each finished task is kept beside --out: a rerun (after a kill, or to add seeds) reads
    them instead of training again and reports the same numbers; other settings are refused."""
    out, result = quick
    assert len(list((out / "r.json.tasks").glob("*.json"))) == 2 * 2 * 2  # protocols, seeds, groups

    def train_again(*args):
        raise AssertionError("a finished task was run again")

    monkeypatch.setattr(bench["main"], "run_seed", train_again)
    again = bench["main"].main(["--quick", "--out", str(out / "r.json")])
    assert again["protocols"] == result["protocols"]
    # the report's time is the rerun's; the kept tasks' own seconds and machine are said apart
    header = bench["report"].markdown(again).splitlines()[2]
    machine = result["machine"]["cpu_model"] or result["machine"]["processor"]
    assert "8 of 8 tasks were read from the files earlier runs kept (" in header, header
    assert f"of their own on {machine}); the time above is this run's." in header, header
    assert "tasks were read" not in bench["report"].markdown(result).splitlines()[2]
    with pytest.raises(bench["main"].ConfigError, match="another configuration"):
        bench["main"].main(["--quick", "--out", str(out / "r.json"), "fct.epochs=3"])


def test_a_task_file_of_a_long_method_group_keeps_a_short_unique_name(bench, tmp_path):
    """The maps config's one group of 15 entries named its task file past the 255 bytes a file
    name may have (``OSError: File name too long`` after the first task had trained): a long
    group is named by its first method, its size and a digest; a short one as before."""
    import yaml

    main = bench["main"]
    config = yaml.safe_load((ROOT / "benchmarks" / "fidelity_maps.yaml").read_text())
    records = main.TaskRecords(tmp_path, main.FidelityConfig())
    group = dict.fromkeys(config["method_groups"][0])
    long = records.path("mnist5k", 0, group)
    assert len(long.name.encode()) <= 255 and long.name.startswith("mnist5k-seed0-independent+14-")
    other = dict.fromkeys([*config["method_groups"][0][1:], "independent"])  # same set, new order
    assert records.path("mnist5k", 0, other) != long
    records.write("mnist5k", 0, group, {"timing": {}})
    assert records.load("mnist5k", 0, group) == {"timing": {"read_from_file": True}}
    short = records.path("regime", 4, dict.fromkeys(["bct", "cores"]))
    assert short.name == "regime-seed4-bct+cores.json"  # the committed tasks' names


def test_the_readme_table_is_the_committed_run(bench):
    """README's result table is rendered from benchmarks/results/fidelity_cpu.json, not typed:
    a new run committed without regenerating the README (or an edited cell) fails here."""
    result = json.loads((ROOT / "benchmarks" / "results" / "fidelity_cpu.json").read_text())
    assert result["config"]["seeds"] == [0, 1, 2, 3, 4]  # the README says seeds 0-4
    table = bench["report"].readme_table(result, "mnist5k/open_set")
    assert len(table.splitlines()) == 2 + len(result["protocols"]["mnist5k/open_set"]["methods"])
    assert table in (ROOT / "README.md").read_text()


def test_the_regime_tables_in_the_docs_are_the_committed_run(bench):
    """docs/fidelity.md's `regime` tables are rendered from
    benchmarks/results/fidelity_regime_cpu.json, not typed: every table of its markdown (the
    report's rows of ``|``) is found in the docs as it renders; an edited cell fails here."""
    result = json.loads((ROOT / "benchmarks" / "results" / "fidelity_regime_cpu.json").read_text())
    assert result["config"]["seeds"] == [0, 1, 2, 3, 4]  # the docs say five seeds
    docs = (ROOT / "docs" / "fidelity.md").read_text()
    tables, table = [], []
    for line in bench["report"].markdown(result).splitlines() + [""]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            tables, table = tables + ["\n".join(table)], []
    assert len(tables) >= 8  # per split: epochs, summary, matrix, kept, backfill, two scores
    missing = [t.splitlines()[2] for t in tables if t not in docs]
    assert not missing, missing


def test_the_maps_table_in_the_docs_is_the_committed_run(bench):
    """docs/fidelity.md's maps table (M(3,1) and the kept share per entry and split) is
    rendered from benchmarks/results/fidelity_maps_cpu.json: an edited cell fails here."""
    result = json.loads((ROOT / "benchmarks" / "results" / "fidelity_maps_cpu.json").read_text())
    assert result["config"]["seeds"] == [0, 1, 2, 3, 4]
    table = bench["report"].maps_table(result)
    assert "| slerp_query |" in table and "kept %" in table.splitlines()[0]
    assert table in (ROOT / "docs" / "fidelity.md").read_text()


class Rotated(torch.nn.Module):
    """A "model" whose features are one fixed projection of the image, rotated by ``R``: any
    two of them differ by an exact rotation, which Procrustes recovers from pairs."""

    def __init__(self, base: torch.Tensor, rotation: torch.Tensor) -> None:
        super().__init__()
        self.base, self.rotation, self.embed_dim = base, rotation, rotation.shape[1]

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        return images.flatten(1) @ self.base @ self.rotation


def test_procrustes_maps_between_rotated_models_serve_as_the_models_themselves(bench):
    """Issue 41, item 5: a query map (composed per hop, or direct) makes model t's queries
    model k's, and a gallery map moves model k's rows to model t's: with models that differ by
    exact rotations, every M(t, k) equals M(k, k) (query side) or M(t, t) (gallery side)."""
    import types

    maps = importlib.import_module("_fidelity_maps")
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(60, 1, 4, 4, generator=gen)
    labels = np.repeat(np.arange(12), 5)
    base = torch.randn(16, 6, generator=gen)
    models = [Rotated(base, torch.linalg.qr(torch.randn(6, 6, generator=gen))[0]) for _ in "abc"]
    data = types.SimpleNamespace(images=images, step_rows=lambda t: torch.arange(20 + 20 * t))
    fits = types.SimpleNamespace(models=models, data=data, seed=0)
    queries = [bench["train"].features(m, images) for m in models]
    own = [bench["eval"].compatibility(bench["eval"].Served(queries, {
        (t, k): queries[k] for t in range(3) for k in range(t + 1)}, labels))[t, t]
        for t in range(3)]  # fmt: skip
    names = ("procrustes_query", "procrustes_query_direct", "procrustes_gallery", "slerp_query")
    for name in names:
        served, extra = maps.serve_map(*maps.MAP_ENTRIES[name][1].split("/")[1:])(
            queries, images, labels, fits
        )
        M = bench["eval"].compatibility(served)
        for t, k in ((1, 0), (2, 0), (2, 1)):
            expected = own[t] if name.endswith("gallery") else own[k]
            assert M[t, k] == pytest.approx(expected), (name, t, k)
        assert extra["pairs_min"] == 40 and extra["pairs_max"] == 60
    served, _ = maps.serve_map("procrustes", "query", "hop", "100")(queries, images, labels, fits)
    assert np.allclose(served.query(2, 0), bench["train"].normalized(queries[0]), atol=1e-4)


# The papers' regime (issue 51; docs/fidelity.md, "Protocol `regime`"): tiny sizes, seconds.
TINY_REGIME = [
    "regime.steps=[6, 8]",
    "regime.test_identities=3",
    "regime.train_per_class=3",
    "regime.val_per_class=2",
    "regime.test_per_class=2",
    "regime.image_size=8",
    "regime.verification_pairs=20",
]


def tiny_regime(bench, *overrides: str):
    from raycompat.config import load_config

    main = bench["main"]
    return load_config(main.FidelityConfig, None, TINY_REGIME + list(overrides))


def test_regime_sizes_are_presets_and_a_key_beside_the_size_overrides_its_value(bench):
    main, train = bench["main"], bench["train"]
    assert main.RegimeSpec().resolved() == main.REGIME_SIZES["cpu"]
    gpu = main.RegimeSpec(size="gpu", epochs=7).resolved()
    assert (gpu.backbone, gpu.image_size, gpu.channels, gpu.epochs) == ("senet18", 32, 3, 7)
    assert gpu.steps == main.REGIME_SIZES["gpu"].steps and gpu.device == "cuda"
    cpu = main.optim(main.FidelityConfig(), "regime")  # the papers' recipe
    assert (cpu.optimizer, cpu.lr, cpu.momentum, cpu.weight_decay) == ("sgd", 0.1, 0.9, 5e-4)
    assert (cpu.batch_size, cpu.schedule, cpu.augment, cpu.padding) == (
        128,
        "cosine",
        "crop_flip",
        2,
    )
    assert cpu.patience is not None and cpu.epochs == main.REGIME_SIZES["cpu"].epochs
    step = main.RegimeSpec(schedule="step").resolved().optim()
    assert step.milestones == (round(0.7 * cpu.epochs),)  # CoReS' 70 of 100
    # the other protocols keep Adam, no stopping rule, no augmentation
    assert main.optim(main.FidelityConfig(), "synthetic") == train.Optim(3, 64, 1e-3)


def test_regime_splits_are_disjoint_and_the_open_set_is_never_trained_on(bench):
    cfg = tiny_regime(bench)
    protocol = bench["main"].PROTOCOLS.get("regime")(cfg.regime, 3)
    rows, data = protocol.rows, protocol.train
    per_class = 3 + 2 + 2
    labels = np.arange(11 * per_class) // per_class  # SyntheticIdentities' rows: c * per_class + i
    parts = [set(rows[name].tolist()) for name in ("train", "validation", "open_set")]
    test = set(np.flatnonzero(labels < 8).tolist()) - parts[0] - parts[1]
    assert all(not a & b for a, b in itertools.combinations([*parts, test], 2))
    assert set(rows["closed_set"].tolist()) <= test  # the test images, never validation's
    for name, count in (("train", 3), ("validation", 2)):
        assert np.bincount(labels[rows[name]]).tolist() == [count] * 8
    assert data.labels.tolist() == labels[rows["train"]].tolist()
    assert data.val_labels.tolist() == labels[rows["validation"]].tolist()
    assert set(labels[rows["open_set"]].tolist()) == {8, 9, 10}  # every image, never trained on
    assert not set(labels[rows["open_set"]].tolist()) & set(data.labels.tolist())
    assert not set(labels[rows["open_set"]].tolist()) & set(data.val_labels.tolist())
    assert set(labels[rows["closed_set"]].tolist()) == set(range(6))  # the first step's
    assert set(data.step_validation(0)[1].tolist()) == set(range(6))
    for split in protocol.evals.values():  # verification pairs index the set; every identity
        pairs = split.scores["verification"].pairs  # has a query and a template row
        assert pairs[:, :2].max() < len(split.labels) and len(pairs) >= 10
        for parity in (0, 1):
            assert set(split.labels[parity::2].tolist()) == set(split.labels.tolist())


def test_the_plateau_stops_a_run_before_its_cap_and_keeps_the_best_epoch(bench, request):
    """min_delta 1 (no gain of a top-1 in [0, 1] can count): the best epoch stays the first, and
    patience 2 ends the run after 3 of its 6 epochs; the weights kept are the first epoch's, the
    same bits as a run capped at 1 epoch. A warm start (IFT) inherits the kept epoch."""
    import dataclasses

    train = bench["train"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    cfg = tiny_regime(bench, "regime.epochs=6", "regime.patience=2", "regime.min_epochs=1",
                      "regime.min_delta=1.0")  # fmt: skip
    protocol = bench["main"].PROTOCOLS.get("regime")(cfg.regime, 0)
    optim = bench["main"].optim(cfg, "regime")
    trainer = train.SequenceTrainer(protocol.train, optim, seed=0)
    ift = trainer.sequence("ift")
    records = trainer.records("ift")
    assert [(r["epochs_run"], r["best_epoch"], r["cap"], r["stopped"]) for r in records] == [
        (3, 1, 6, "plateau")
    ] * 2
    assert [r["epochs_inherited"] for r in records] == [0, 1]
    assert [r["epochs_cumulative"] for r in records] == [3, 4]
    assert len(records[0]["val_top1"]) == 3
    once = train.SequenceTrainer(protocol.train, dataclasses.replace(optim, epochs=1), seed=0)
    first = once.sequence("independent")[0]
    assert once.records("independent")[0]["stopped"] == "cap"
    for (name, a), b in zip(ift[0].state_dict().items(), first.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_regime_report_carries_epochs_against_the_cap_and_every_score(bench, tmp_path):
    out = tmp_path / "r.json"
    result = bench["main"].main(
        TINY_REGIME
        + [
            "protocols=[regime]",
            "seeds=[0]",
            "processes=1",
            "threads=1",
            "methods=[independent, ift, cores, fct]",
            "regime.epochs=3",
            "regime.patience=1",
            "regime.min_epochs=1",
            "fct.width=8",
            "fct.epochs=1",
            "fct.batch_size=8",
            "fct.warmup_epochs=0",
            "--out",
            str(out),
            "--markdown",
            str(tmp_path / "r.md"),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert sorted(result["protocols"]) == ["regime/closed_set", "regime/open_set"]
    for protocol in result["protocols"].values():
        for name, method in protocol["methods"].items():
            run = method["runs"][0]
            check_computed(run, 2)
            for record in run["training"]:
                assert record["cap"] == 3 and 1 <= record["best_epoch"] <= record["epochs_run"] <= 3
                assert record["stopped"] in ("plateau", "cap")
            for score in ("verification", "templates"):
                assert math.isfinite(run["scores"][score]["AC"])
                assert run["scores"][score]["matrix"][0][1] is None
            assert len(result["training_curves"]["regime"][name][0]) == 2  # seed 0: 2 models
    text = (tmp_path / "r.md").read_text()
    assert "model 1: run / cap (kept)" in text and " / 3 (" in text
    assert "1:1 verification" in text and "class-mean templates" in text


@pytest.mark.parametrize("size", ["cpu", "gpu"])
def test_the_regime_configs_parse_with_every_method_at_its_registered_defaults(bench, size):
    from raycompat.config import load_config

    main = bench["main"]
    path = ROOT / "benchmarks" / f"fidelity_regime_{size}.yaml"
    assert f"--config benchmarks/fidelity_regime_{size}.yaml" in path.read_text()
    cfg = load_config(main.FidelityConfig, path, [])
    assert cfg.protocols == ["regime"] and cfg.regime.size == size and cfg.seeds == [0, 1, 2, 3, 4]
    assert cfg.regime.resolved() == main.REGIME_SIZES[size]
    # d-Simplex-HOC at the registry's lambda and rho, not the demo's rho 5
    import inspect

    from raycompat.methods import METHODS

    defaults = inspect.signature(METHODS.get("dsimplex_hoc")).parameters
    expected = {"lam": defaults["lam"].default, "rho": defaults["rho"].default}
    assert cfg.method_options == {"dsimplex_hoc": expected}
