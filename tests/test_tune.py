"""Ray Tune sweeps: space and objective units, then a real 4-trial sweep on 2 CPUs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raycompat.config import load_config
from raycompat.metrics.compatibility import CompatibilityMatrix
from raycompat.train.config import TrainConfig
from raycompat.train.scenarios import plan_steps
from raycompat.tune.config import ParamSpec
from raycompat.tune.objectives import OBJECTIVES
from raycompat.tune.results import pareto_front
from raycompat.tune.space import param_space, trial_overrides

ROOT = Path(__file__).parent.parent


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


def load_job(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_job", ROOT / "jobs" / f"{name}.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


@pytest.mark.ray
@pytest.mark.slow
def test_four_trial_sweep_survives_a_failing_trial_and_resumes(ray_local, tmp_path):
    base = [
        "data.name=synthetic",
        "data.options={num_classes: 6, images_per_class: 40, image_size: 28, channels: 1}",
        "model.num_classes=6",
        "model.backbone_kwargs={in_chans: 1, image_size: 28}",
        "scenario.tasks=[3,3]",
        "scenario.replay_per_class=5",
        "data.loader=sampler",
        "epochs=1",
        "eval.val_fraction=0.2",
        "scaling.num_workers=1",
        "run.max_failures=0",
        "optim.name=adam",
        "optim.lr=0.003",
        "optim.weight_decay=0.0",
    ]
    args = [
        "--config",
        str(ROOT / "configs" / "tune_hoc_lambda.yaml"),
        f"overrides={base!r}".replace("'", '"'),
        "space=[{key: method_options.lam, values: [0.1, 0.5]},"
        " {key: run.inject_failure, values: [null, {step: 1, epoch: 0, batch: 0}]}]",
        f"storage_path={tmp_path}",
        "name=toy",
    ]
    job = load_job("tune")
    first = job.main(args)
    assert first["trials"] == 4 and first["status"] == {"TERMINATED": 2, "ERROR": 2}
    results = tmp_path / "toy" / "results"
    table = pd.read_csv(results / "trials.csv")
    assert table.loc[table.status == "ERROR", "error"].str.contains("injected failure").all()
    assert (results / "tradeoff.png").stat().st_size > 0
    assert first["best"]["run.inject_failure"] is None  # only finished trials can win
    best = load_config(TrainConfig, results / "best_config.yaml")
    assert best.method_options["lam"] == first["best"]["method_options.lam"]
    assert plan_steps(best)

    again = job.main(args)  # same command: restores, retries the errored trials only
    assert again["status"] == {"TERMINATED": 4}
    table = pd.read_parquet(results / "trials.parquet")
    assert table["objective"].notna().all() and len(table) == 4

    # The best trial as an upgrade history: it validates and runs through jobs/upgrade.py.
    from raycompat.upgrade.config import UpgradeConfig, check_upgrade_config

    history = load_config(UpgradeConfig, results / "best_upgrade.yaml")
    check_upgrade_config(history)
    assert [(u.classes, u.method) for u in history.upgrades] == [
        (3, "independent"),
        (6, "dsimplex_hoc"),
    ]
    assert history.upgrades[1].method_options["lam"] == again["best"]["method_options.lam"]
    summary = load_job("upgrade").main(
        [
            "--config",
            str(results / "best_upgrade.yaml"),
            f"store.root={tmp_path}/store",
            f"report_dir={tmp_path}/report",
            f"work_dir={tmp_path}/work",
            f"training.run.storage_path={tmp_path}/runs",
        ]
    )
    assert summary["decisions"]["m1"] == "initial"
    assert summary["decisions"]["m2"] in ("compatible", "refuse")
    assert len(summary["matrix"]) == 2
    assert (tmp_path / "report" / "toy-best" / "report.md").is_file()


def test_optuna_search_refuses_grid_parameters():
    from raycompat.tune.config import SweepConfig
    from raycompat.tune.sweep import search_algorithm

    sweep = SweepConfig(search="optuna", space=[ParamSpec("epochs", "grid", values=[1, 2])])
    with pytest.raises(ValueError, match="use choice, not grid"):
        search_algorithm(sweep)
    sweep.space = [ParamSpec("optim.lr", "loguniform", low=1e-4, high=1e-2)]
    assert type(search_algorithm(sweep)).__name__ == "OptunaSearch"
