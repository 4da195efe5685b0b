"""Ray Tune sweeps: space and objective units, then real (2-trial) sweeps on 2 CPUs."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raycompat.cluster.tune.fct import check_transformation, split_params, transformation_of
from raycompat.cluster.tune.objectives import OBJECTIVES
from raycompat.cluster.tune.results import pareto_front
from raycompat.cluster.tune.space import param_space, trial_overrides
from raycompat.config import load_config
from raycompat.config.fct import FCTSpec
from raycompat.config.train import TrainConfig
from raycompat.config.tune import ParamSpec, SweepConfig
from raycompat.errors import ConfigError
from raycompat.metrics.compatibility import CompatibilityMatrix
from raycompat.train.scenarios import plan_steps
from tests.conftest import bucket_objects

ROOT = Path(__file__).parents[3]


def test_pareto_front_on_hand_placed_points():
    x = np.array([0.1, 0.5, 0.5, 0.9, 0.2])
    y = np.array([0.9, 0.6, 0.5, 0.1, 0.2])
    # (0.5, 0.5) is beaten by (0.5, 0.6); (0.2, 0.2) by (0.5, 0.6); the rest trade off.
    assert pareto_front(x, y).tolist() == [True, True, False, True, False]


def test_space_kinds_and_errors():
    space = param_space(
        [
            ParamSpec("optim.lr", "loguniform", low=1e-4, high=1e-1),
            ParamSpec("epochs", "grid", values=[1, 2]),
        ]
    )
    assert set(space) == {"optim.lr", "epochs"}
    with pytest.raises(ValueError, match="low < high"):
        param_space([ParamSpec("optim.lr", "uniform", low=1.0, high=0.5)])
    with pytest.raises(ValueError, match="non-empty 'values'"):
        param_space([ParamSpec("epochs", "choice")])
    with pytest.raises(ValueError, match="appears twice"):
        param_space([ParamSpec("epochs", values=[1]), ParamSpec("epochs", values=[2])])


def test_trial_overrides_round_trip_through_the_typed_config():
    overrides = trial_overrides(
        {"method_options.lam": 0.25, "epochs": 3, "run.inject_failure": {"step": 1, "epoch": 0}}
    )
    cfg = load_config(TrainConfig, None, overrides)
    assert cfg.method_options == {"lam": 0.25} and cfg.epochs == 3
    assert cfg.run.inject_failure.step == 1


def test_objectives_on_a_hand_built_matrix():
    m = CompatibilityMatrix.from_array(np.array([[0.6, 0.0], [0.7, 0.8]]))
    summary = {"AC": 1.0, "AA": (0.6 + 0.7 + 0.8) / 3, "ACA": 0.7}
    assert OBJECTIVES.get("self_test")(summary, m) == 0.8
    assert OBJECTIVES.get("ecc_self_test")(summary, m) == pytest.approx(1.8)  # 0.7 > 0.6
    worse = CompatibilityMatrix.from_array(np.array([[0.6, 0.0], [0.5, 0.8]]))
    assert OBJECTIVES.get("ecc_self_test")(summary, worse) == pytest.approx(0.8)
    assert OBJECTIVES.get("update_gain")(summary, m) == pytest.approx((0.7 - 0.6) / (0.8 - 0.6))
    flat = CompatibilityMatrix.from_array(np.array([[0.6, 0.0], [0.5, 0.6]]))
    assert np.isnan(OBJECTIVES.get("update_gain")(summary, flat))  # M(T,T) == M(T-1,T-1)
    assert OBJECTIVES.get("ACA")(summary, m) == 0.7


def test_cross_test_objective_is_the_last_models_query_against_the_previous_gallery():
    m = CompatibilityMatrix.from_array(
        np.array([[0.6, 0.0, 0.0], [0.7, 0.8, 0.0], [0.5, 0.65, 0.9]])
    )
    assert OBJECTIVES.get("cross_test")({}, m) == 0.65
    with pytest.raises(ValueError, match="at least two models"):
        OBJECTIVES.get("cross_test")({}, CompatibilityMatrix.from_array(np.array([[0.6]])))


def test_transformation_keys_split_from_training_keys_and_reach_the_fct_spec():
    sweep = load_config(SweepConfig, ROOT / "configs" / "tune_fct_width.yaml")
    params = {"transformation.width": 64, "transformation.optim.lr": 0.01, "epochs": 2}
    training, transformation = split_params(params)
    assert training == {"epochs": 2}
    assert transformation == {"width": 64, "optim.lr": 0.01}
    spec = transformation_of(sweep, params)
    assert (spec.width, spec.optim.lr, spec.epochs) == (64, 0.01, sweep.transformation.epochs)
    assert sweep.transformation.width == 256  # the sweep's own section is not mutated


def test_transformation_sweeps_are_checked_before_any_trial():
    base = load_config(TrainConfig, ROOT / "configs" / "train_mnist_two_model.yaml")
    width = [ParamSpec("transformation.width", values=[16, 64])]
    with pytest.raises(ConfigError, match="add a 'transformation:' section"):
        check_transformation(SweepConfig(space=width), base)
    with pytest.raises(ConfigError, match="method is 'nifcl_rw'"):
        check_transformation(SweepConfig(space=width, transformation=FCTSpec()), base)
    fct = load_config(TrainConfig, ROOT / "configs" / "train_mnist_two_model.yaml", ["method=fct"])
    check_transformation(SweepConfig(space=width, transformation=FCTSpec()), fct)
    typo = [ParamSpec("transformation.widht", values=[16])]
    with pytest.raises(ConfigError, match="'transformation.widht' is not an FCTSpec key"):
        check_transformation(SweepConfig(space=typo, transformation=FCTSpec()), fct)


def test_backfill_objectives_score_the_validation_curve_of_hand_made_features():
    """Four validation images of two classes; h maps image 0 into class 1's direction and is
    most uncertain about it. By hand (cosine, query excluded by index), on the grid 0, 0.5, 1:
    top-1 0.25 with h(old) alone, 1.0 once images 0 and 1 are re-extracted."""
    from raycompat.cluster.tune.fct import backfill_metrics
    from raycompat.cluster.tune.sweep import final_metrics
    from raycompat.config.upgrade import PartialBackfillSpec
    from raycompat.upgrade.backfill_eval import backfill_evaluation

    labels = np.array([0, 0, 1, 1])
    new = np.array([[1, 0.1], [1, -0.1], [0.1, 1], [-0.1, 1]], np.float32)
    transformed = new.copy()
    transformed[0] = [0, 1]
    uncertainty = np.array([5.0, 0.0, 0.0, 0.0])
    spec = PartialBackfillSpec(budget=0.25, target=0.95)
    evaluation = backfill_evaluation(
        new, transformed, uncertainty, labels, spec, fractions=[0.0, 0.5, 1.0]
    )
    extra = backfill_metrics(evaluation)
    assert extra["backfill_auc"] == pytest.approx(0.5 * (0.25 + 1.0) / 2 + 0.5 * 1.0)
    assert extra["backfill_top1_at_budget"] == pytest.approx(0.625)
    assert extra["backfill_budget_for_target"] == 0.5
    assert naive_top1(new, transformed, labels) == 0.25  # the curve's start, by a naive top-1

    matrix = CompatibilityMatrix.from_array(np.array([[0.6, 0.0], [0.25, 1.0]]))
    for name, value in [("backfill_auc", 0.8125), ("backfill_top1_at_budget", 0.625)]:
        sweep = SweepConfig(objective=name, transformation=FCTSpec(), backfill=spec)
        final = final_metrics(sweep, matrix, extra)
        assert final["objective"] == pytest.approx(value)
        with pytest.raises(ValueError, match="'backfill:' section"):
            OBJECTIVES.get(name)({}, matrix)


def test_backfill_sweeps_are_checked_before_any_trial():
    from raycompat.cluster.tune.fct import backfill_of
    from raycompat.config.upgrade import PartialBackfillSpec

    fct = load_config(TrainConfig, ROOT / "configs" / "train_mnist_two_model.yaml", ["method=fct"])
    weight = [ParamSpec("backfill.uncertainty_weight", values=[0.0, 1.0])]
    spec = PartialBackfillSpec(budget=0.3)
    with pytest.raises(ConfigError, match="add a 'backfill:' section"):
        check_transformation(SweepConfig(space=weight, transformation=FCTSpec()), fct)
    with pytest.raises(ConfigError, match="objective backfill_auc"):
        check_transformation(SweepConfig(objective="backfill_auc"), fct)
    with pytest.raises(ConfigError, match="add a 'transformation:' section"):
        check_transformation(SweepConfig(space=weight, backfill=spec), fct)
    typo = [ParamSpec("backfill.weight", values=[1.0])]
    with pytest.raises(ConfigError, match="'backfill.weight' is not a PartialBackfillSpec key"):
        check_transformation(SweepConfig(space=typo, transformation=FCTSpec(), backfill=spec), fct)

    sweep = load_config(SweepConfig, ROOT / "configs" / "tune_backfill.yaml")
    params = {"backfill.uncertainty_weight": 3.0, "transformation.width": 64, "epochs": 2}
    assert split_params(params) == ({"epochs": 2}, {"width": 64})
    trial = backfill_of(sweep, params)
    assert (trial.uncertainty_weight, trial.budget) == (3.0, sweep.backfill.budget)
    assert sweep.backfill.uncertainty_weight == 1.0  # the sweep's own section is not mutated
    assert backfill_of(SweepConfig(), params) is None


def test_best_backfill_trial_becomes_an_upgrade_history_with_its_partial_backfill(tmp_path):
    from raycompat.cluster.tune.results import write_best_config
    from raycompat.config.upgrade import UpgradeConfig, check_upgrade_config

    sweep = load_config(SweepConfig, ROOT / "configs" / "tune_backfill.yaml")
    write_best_config(sweep, {"backfill.uncertainty_weight": 0.3}, tmp_path / "best.yaml")
    history = load_config(UpgradeConfig, tmp_path / "best_upgrade.yaml")
    check_upgrade_config(history)
    assert history.upgrades[0].partial_backfill is None  # the initial model
    backfill = history.upgrades[1].partial_backfill
    assert (backfill.uncertainty_weight, backfill.budget) == (0.3, 0.3)


def test_best_fct_trial_becomes_an_upgrade_history_with_its_transformation(tmp_path):
    from raycompat.cluster.tune.results import write_best_config
    from raycompat.config.upgrade import UpgradeConfig, check_upgrade_config

    sweep = load_config(SweepConfig, ROOT / "configs" / "tune_fct_width.yaml")
    write_best_config(sweep, {"transformation.width": 64}, tmp_path / "best_config.yaml")
    best = load_config(TrainConfig, tmp_path / "best_config.yaml")
    assert best.method == "fct"
    history = load_config(UpgradeConfig, tmp_path / "best_upgrade.yaml")
    check_upgrade_config(history)
    assert [(u.classes, u.method) for u in history.upgrades] == [(5, "independent"), (10, "fct")]
    assert history.upgrades[1].fct.width == 64
    assert history.upgrades[1].fct.epochs == sweep.transformation.epochs


def test_best_config_drops_a_searched_failure_injection(tmp_path):
    """A trial that ran with run.inject_failure (and recovered) can be the best; its config
    must still train cleanly, alone and as an upgrade history."""
    from raycompat.cluster.tune.results import write_best_config
    from raycompat.config.upgrade import UpgradeConfig

    sweep = load_config(SweepConfig, ROOT / "configs" / "tune_hoc_lambda.yaml")
    params = {"method_options.lam": 0.5, "run.inject_failure": {"step": 1, "epoch": 0}}
    best = write_best_config(sweep, params, tmp_path / "best_config.yaml")
    assert best.run.inject_failure is None and best.method_options["lam"] == 0.5
    assert load_config(TrainConfig, tmp_path / "best_config.yaml").run.inject_failure is None
    for name in ("best_config.yaml", "best_upgrade.yaml"):  # private: they name local paths
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    history = load_config(UpgradeConfig, tmp_path / "best_upgrade.yaml")
    assert history.training.run.inject_failure is None


def toy_cl2r(classes: int, per_class: int, *extra: str) -> str:
    """``overrides=[...]`` turning a HOC sweep's MNIST base into a seconds-long synthetic CL2R
    run of two tasks (one worker, one epoch, a validation split)."""
    half = classes // 2
    overrides = [
        "data.name=synthetic",
        f"data.options={{num_classes: {classes}, images_per_class: {per_class}, image_size: 28,"
        " channels: 1}",
        f"model.num_classes={classes}",
        "model.backbone_kwargs={in_chans: 1, image_size: 28}",
        f"scenario.tasks=[{half},{half}]",
        "scenario.replay_per_class=5",
        "data.loader=sampler",
        "epochs=1",
        "eval.val_fraction=0.2",
        "scaling.num_workers=1",
        *extra,
    ]
    return f"overrides={overrides!r}".replace("'", '"')


def load_job(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_job", ROOT / "jobs" / f"{name}.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_on_s3_survives_a_failing_trial_and_resumes_from_the_bucket(
    ray_local, s3_server, s3_bucket, tmp_path, monkeypatch, capfd
):
    """Stored on S3 (moto): Tune's state, the trial runs and the results land in the bucket and
    nowhere else; a rerun restores from the bucket and retries only the errored trials. Two
    trials, the fewest that show it: the same lambda with and without an injected failure. The
    environment's credentials (a sweep config has no storage options) reach no object of the
    bucket, no local file and no line of output."""
    import os

    import s3fs

    bucket, storage_options = s3_bucket
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    args = [
        "--config",
        str(ROOT / "configs" / "tune_hoc_lambda.yaml"),
        f"base={ROOT / 'configs' / 'train_mnist_cl2r.yaml'}",
        toy_cl2r(6, 40, "run.max_failures=0", "optim.lr=0.003", "optim.weight_decay=0.0"),
        "space=[{key: method_options.lam, values: [0.5]},"
        " {key: run.inject_failure, values: [null, {step: 1, epoch: 0, batch: 0}]}]",
        f"storage_path=s3://{bucket}/sweeps",
        f"endpoint_url={s3_server}",
        "name=toy",
    ]
    job = load_job("tune")
    first = job.main(args)
    assert first["trials"] == 2 and first["status"] == {"TERMINATED": 1, "ERROR": 1}
    assert first["output_dir"] == f"s3://{bucket}/sweeps/toy/results"
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options)
    results = tmp_path / "results"
    fs.get(f"{bucket}/sweeps/toy/results/", str(results), recursive=True)
    table = pd.read_csv(results / "trials.csv")
    assert table.loc[table.status == "ERROR", "error"].str.contains("injected failure").all()
    for run_path in table.loc[table.status == "TERMINATED", "run_path"]:
        assert run_path.startswith(f"s3://{bucket}/sweeps/toy/runs/")
        assert fs.exists(f"{run_path}/summary.json")  # each trial's training run, in the bucket
    assert (results / "tradeoff.png").stat().st_size > 0
    assert not list(workdir.iterdir())  # nothing was written to the working folder
    assert first["best"]["run.inject_failure"] is None  # only finished trials can win
    best = load_config(TrainConfig, results / "best_config.yaml")
    assert best.method_options["lam"] == first["best"]["method_options.lam"]
    assert plan_steps(best)

    again = job.main(args)  # same command: restores, retries the errored trials only
    assert again["status"] == {"TERMINATED": 2}
    fs.get(f"{bucket}/sweeps/toy/results/", str(results), recursive=True)
    table_again = pd.read_parquet(results / "trials.parquet")
    assert table_again["objective"].notna().all() and len(table_again) == 2
    assert set(table["trial"]) == set(table_again["trial"])  # the same trials, restored

    # The best trial as an upgrade history: it validates, and jobs/upgrade.py --dry-run
    # resolves and checks its every input and output (the job's runs are tested on their own)
    from raycompat.config.upgrade import UpgradeConfig, check_upgrade_config

    history = load_config(UpgradeConfig, results / "best_upgrade.yaml")
    check_upgrade_config(history)
    assert [(u.classes, u.method) for u in history.upgrades] == [
        (3, "independent"),
        (6, "dsimplex_hoc"),
    ]
    assert history.upgrades[1].method_options["lam"] == again["best"]["method_options.lam"]
    with pytest.raises(SystemExit) as dry_run:
        load_job("upgrade").main(
            [
                "--config",
                str(results / "best_upgrade.yaml"),
                f"store.root={tmp_path}/store",
                f"report_dir={tmp_path}/report",
                f"work_dir={tmp_path}/work",
                f"training.run.storage_path={tmp_path}/runs",
                "--dry-run",
            ]
        )
    assert dry_run.value.code == 0
    assert not (tmp_path / "report").exists() and not (tmp_path / "store").exists()

    secrets = [os.environ[name].encode() for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]
    blobs = bucket_objects(fs, bucket)
    assert any(p.endswith("best_upgrade.yaml") for p in blobs) and len(blobs) > 20
    blobs |= {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    out, err = capfd.readouterr()
    blobs |= {"stdout": out.encode(), "stderr": err.encode()}
    leaks = [p for p, data in blobs.items() if any(s in data for s in secrets)]
    assert not leaks, f"credentials found in {leaks[:5]}"


def test_optuna_search_refuses_grid_parameters():
    from raycompat.cluster.tune.sweep import search_algorithm

    sweep = SweepConfig(search="optuna", space=[ParamSpec("epochs", "grid", values=[1, 2])])
    with pytest.raises(ValueError, match="use choice, not grid"):
        search_algorithm(sweep)
    sweep.space = [ParamSpec("optim.lr", "loguniform", low=1e-4, high=1e-2)]
    assert type(search_algorithm(sweep)).__name__ == "OptunaSearch"


def naive_top1(query: np.ndarray, gallery: np.ndarray, labels: np.ndarray) -> float:
    """1:N cosine top-1 with the query's own row excluded, one query at a time."""
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    hits = 0
    for i in range(len(q)):
        sims = g @ q[i]
        sims[i] = -np.inf
        hits += labels[int(np.argmax(sims))] == labels[i]
    return hits / len(q)


@pytest.mark.ray
@pytest.mark.slow
def test_fct_width_sweep_scores_each_trial_on_its_own_transformation(
    ray_local, tmp_path, capfd, caplog
):
    """Two widths: each trial learns h after training and its cross-test is M(new, h(old)),
    recomputed here from the trial's stored features and h with a naive top-1. The console
    holds one line per trial and none of Tune's tables (those are results/trials.csv)."""
    from raycompat.cluster.train.fct_fit import transform_features
    from raycompat.config.upgrade import UpgradeConfig
    from raycompat.train.data import make_splits, open_dataset
    from raycompat.train.export import load_features
    from raycompat.transformations import load_transformation

    base = [
        "method=fct",
        "data.name=synthetic",
        "data.options={num_classes: 6, images_per_class: 40, image_size: 28, channels: 1,"
        " difficulty: 0.3}",
        "model.num_classes=6",
        "model.embed_dim=8",
        "model.backbone_kwargs={in_chans: 1, image_size: 28}",
        "scenario.tasks=[3,6]",
        "epochs=1",
        "scaling.num_workers=1",
    ]
    summary = load_job("tune").main(
        [
            "--config",
            str(ROOT / "configs" / "tune_fct_width.yaml"),
            f"overrides={base!r}".replace("'", '"'),
            "transformation={epochs: 2, batch_size: 32, optim: {warmup_epochs: 1}}",
            "space=[{key: transformation.width, values: [8, 32]}]",
            f"storage_path={tmp_path}",
            "name=fct",
        ]
    )
    assert summary["status"] == {"TERMINATED": 2}
    out, err = capfd.readouterr()
    for tune_table in ("╭", "Trial status:", "Configuration for experiment", "Trial name"):
        assert tune_table not in out + err, f"{tune_table!r} on the console:\n{out}{err}"
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name == "raycompat.cluster.tune")
    trials = re.findall(r"\[(\d)/2\] trial \w+ \(transformation\.width=(\d+)\): objective=", ours)
    assert sorted(p for p, _ in trials) == ["1", "2"], ours  # one line per trial, numbered
    assert sorted(int(w) for _, w in trials) == [8, 32], ours
    table = pd.read_csv(tmp_path / "fct" / "results" / "trials.csv")
    assert sorted(table["param:transformation.width"]) == [8, 32]
    for _, row in table.iterrows():
        run = Path(row["run_path"])
        cfg = load_config(TrainConfig, run / "config.yaml")
        dataset = open_dataset(cfg.data)
        labels = dataset.labels[make_splits(cfg, dataset.labels).val]
        steps = json.loads((run / "state.json").read_text())["steps"]
        old, new = (load_features(steps[s]["checkpoint"], "val") for s in ("step_1", "step_2"))
        h = load_transformation(tmp_path / "fct" / "work" / f"{run.name}-h" / "h")
        assert h.mixer[-1].in_features == row["param:transformation.width"]
        assert row["cross_test"] == pytest.approx(
            naive_top1(new, transform_features(h, old), labels)
        )
        assert row["stored_cross_test"] == pytest.approx(naive_top1(new, old, labels))
        assert row["self_test"] == pytest.approx(naive_top1(new, new, labels))
        assert row["objective"] == row["cross_test"]
    history = load_config(UpgradeConfig, tmp_path / "fct" / "results" / "best_upgrade.yaml")
    assert history.upgrades[1].fct.width == summary["best"]["transformation.width"]


def test_sweep_locations_local_and_s3(tmp_path):
    from raycompat.cluster.tune.sweep import runs_path, sweep_path

    local = SweepConfig(storage_path=str(tmp_path / "sweeps"), name="a")
    assert sweep_path(local) == str(tmp_path / "sweeps" / "a")
    assert runs_path(local) == str(tmp_path / "sweeps" / "a" / "runs")
    remote = SweepConfig(storage_path="s3://bucket/team/sweeps/", name="a")
    assert sweep_path(remote) == "s3://bucket/team/sweeps/a"
    assert runs_path(remote) == "s3://bucket/team/sweeps/a/runs"


def test_sweep_storage_with_refused_credentials_fails_naming_the_location(
    s3_server, s3_bucket, s3_strict_auth
):
    import os

    from raycompat.cluster.tune.sweep import check_storage

    bucket, _ = s3_bucket
    sweep = SweepConfig(storage_path=f"s3://{bucket}/sweeps", endpoint_url=s3_server, name="x")
    with pytest.raises(PermissionError) as err:
        check_storage(sweep)  # the session's credentials are refused while strict auth is on
    message = str(err.value)
    assert f"s3://{bucket}/sweeps/x" in message and "credentials" in message
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in message


def test_trial_scratch_is_kept_locally_and_removed_for_s3_sweeps(tmp_path):
    from raycompat.cluster.tune.sweep import scratch_dir

    with scratch_dir(SweepConfig(storage_path=str(tmp_path), name="a")) as work:
        assert work == str(tmp_path / "a" / "work")
    with scratch_dir(SweepConfig(storage_path="s3://bucket/sweeps", name="a")) as work:
        assert Path(work).is_dir() and "raycompat-a-" in work
    assert not Path(work).exists()


def test_trial_table_tells_finished_stopped_and_failed_trials_apart():
    """A trial ASHA stopped has per-epoch metrics but no final report: no objective, and it
    cannot be the best; an errored one keeps its message."""
    from types import SimpleNamespace

    from raycompat.cluster.tune.results import best_params, trial_table

    sweep = SweepConfig(space=[ParamSpec("optim.lr", "loguniform", low=1e-4, high=1e-1)])
    final = {"final": True, "objective": 0.5, "AC": 0.0, "AA": 0.5, "run_path": "/runs/a"}
    results = [
        SimpleNamespace(path="/s/a", config={"optim.lr": 0.01}, metrics=final, error=None),
        SimpleNamespace(
            path="/s/b", config={"optim.lr": 0.02}, metrics={"objective": 0.9}, error=None
        ),
        SimpleNamespace(
            path="/s/c",
            config={"optim.lr": 0.03},
            metrics={},
            error=RuntimeError("Traceback ...\nValueError: bad lr"),
        ),
    ]
    table = trial_table(results, sweep)
    assert table["status"].tolist() == ["TERMINATED", "STOPPED", "ERROR"]
    assert table["objective"].isna().tolist() == [False, True, True]
    assert table["error"].tolist()[2] == "ValueError: bad lr"
    assert table["run_path"].tolist()[0] == "/runs/a"
    assert best_params(table, sweep) == {"optim.lr": 0.01}  # not the stopped 0.9


def test_asha_max_t_must_leave_room_for_the_final_report():
    from raycompat.cluster.tune.sweep import check_asha
    from raycompat.config.tune import ASHASpec

    base = load_config(TrainConfig, ROOT / "configs" / "train_mnist_two_model.yaml")  # 3 + 3
    check_asha(SweepConfig(asha=ASHASpec(max_t=7)), base)
    with pytest.raises(ConfigError, match="reports 6 epochs .* at least 7"):
        check_asha(SweepConfig(asha=ASHASpec(max_t=6)), base)
    longer = [ParamSpec("epochs", values=[2, 5])]  # the longest trial counts: 5 + 5
    with pytest.raises(ConfigError, match="reports 10 epochs"):
        check_asha(SweepConfig(asha=ASHASpec(max_t=7), space=longer), base)


def test_unwritable_local_sweep_storage_fails_naming_the_folder(tmp_path):
    from raycompat.cluster.tune.sweep import check_storage

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the sweep folder should go")
    sweep = SweepConfig(storage_path=str(blocker / "sweeps"), name="x")
    with pytest.raises(PermissionError, match=f"{blocker / 'sweeps' / 'x'}.*writable"):
        check_storage(sweep)


def test_a_trial_that_ends_is_one_line_and_tunes_console_is_off_unless_verbose(monkeypatch):
    """No Ray: the line of a finished, a stopped and a failed trial, and Tune's output engine
    switched for the fit only."""
    import os
    from types import SimpleNamespace

    from raycompat.cluster.tune.console import NEW_OUTPUT_ENV, trial_line, tune_console

    def trial(status: str, result: dict, error_file: str | None = None):
        return SimpleNamespace(
            trial_id="3b09e_00001",
            status=status,
            TERMINATED="TERMINATED",
            ERROR="ERROR",
            last_result=result,
            error_file=error_file,
            config={"method_options.lam": 0.1, "epochs": 2},
        )

    final = {"final": True, "objective": 0.72222, "AC": 1.0, "AA": 0.84259, "self_test": 0.9}
    params = ["method_options.lam"]
    assert trial_line(trial("TERMINATED", final), 2, 4, params, 95.2) == (
        "[2/4] trial 3b09e_00001 (method_options.lam=0.1): objective=0.7222 AC=1 AA=0.8426"
        " | ETA 95s"
    )
    stopped = trial("TERMINATED", {"objective": 0.5, "training_iteration": 3})
    assert trial_line(stopped, 3, 4, [], None) == (
        "[3/4] trial 3b09e_00001: stopped by the scheduler after 3 reports"
    )
    failed = trial("ERROR", {}, "/s/toy/3b09e_00001/error.txt")
    assert trial_line(failed, 4, 4, params, None).endswith(
        ": failed (error in /s/toy/3b09e_00001/error.txt)"
    )

    monkeypatch.delenv(NEW_OUTPUT_ENV, raising=False)
    with tune_console(verbose=False):
        assert os.environ[NEW_OUTPUT_ENV] == "0"  # Tune's first engine: silent at verbose=0
    assert NEW_OUTPUT_ENV not in os.environ
    with tune_console(verbose=True):
        assert NEW_OUTPUT_ENV not in os.environ  # --verbose: Tune's console as Ray prints it


def test_a_restore_keeps_tunes_warning_of_trials_without_results_off_the_console(caplog):
    """A sweep killed before a trial's first report: Tune's restore warns that the trial has no
    result.json (seen as the one foreign line of test_resume's rerun); the trial is resumed,
    so unless verbose the warning is dropped for the restore only."""
    import logging

    from ray.tune.analysis import experiment_analysis

    from raycompat.cluster.tune.console import RESULTS_READER, quiet_restore

    reader = experiment_analysis.logger  # the logger Tune's restore warns through
    assert reader.name == RESULTS_READER
    missing = "Failed to fetch metrics for 1 trial(s)"
    caplog.set_level(logging.WARNING)
    with quiet_restore(verbose=False):
        reader.warning(missing)
    assert missing not in caplog.text
    reader.warning("after the restore")  # its level is put back
    with quiet_restore(verbose=True):
        reader.warning(missing)
    assert "after the restore" in caplog.text and missing in caplog.text


def test_a_sweep_without_ac_and_aa_plots_an_empty_tradeoff_without_a_warning(tmp_path):
    """A sweep scored on its self-test reports no AC/AA: its tradeoff plot says so, and
    matplotlib's "No artists with labels found" warning stays off the console (issue 52,
    item 7: it was the one foreign line of a resumed sweep)."""
    import warnings

    from raycompat.cluster.tune.results import plot_tradeoff

    table = pd.DataFrame({"trial": ["a_00000", "a_00001"], "AC": [None, None], "AA": [None, None]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_tradeoff(table, tmp_path / "tradeoff.png")
    assert (tmp_path / "tradeoff.png").stat().st_size > 0
