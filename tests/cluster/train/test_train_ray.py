"""Ray Train component tests: real local Ray, 2 CPU workers, toy data (synthetic identities).

Each test runs the training driver the way ``jobs/train.py`` does and checks what it stored.
Every Ray Train run costs a fixed start-up (controller, worker group, process group) far above
its toy training, so tests that need the same run share it through a module-scoped fixture
(``ddp_run``, ``cores_run``, ``cl2r_job_run``, ``two_model_s3_run``), and a test that is not
about workers runs one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from raycompat.config import load_config
from raycompat.config.train import TrainConfig
from raycompat.train.data import make_splits, open_dataset, step_rows
from raycompat.train.export import load_exported_model
from raycompat.train.scenarios import plan_steps

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TOY = [
    "data.name=synthetic",
    "data.options={num_classes: 6, images_per_class: 40, image_size: 28, channels: 1, seed: 3}",
    "model.num_classes=6",
    "optim.name=adam",
    "optim.lr=0.003",
    "optim.weight_decay=0.0",
    "optim.schedule=constant",
    "eval.batch_size=128",
    "epochs=2",
    "batch_size=32",
]


def toy_config(tmp_path, *overrides) -> TrainConfig:
    return load_config(TrainConfig, None, [*TOY, f"run.storage_path={tmp_path}", *overrides])


def run(cfg):
    from raycompat.cluster.train.driver import run_training

    return run_training(cfg)


def checkpoint_dir(result, step: str) -> str:
    return result.checkpoints[step].path


def naive_identification(features: np.ndarray, labels: np.ndarray) -> float:
    """1:N top-1 by brute force, the query excluded by index (reference for the matrix)."""
    f = features / np.linalg.norm(features, axis=1, keepdims=True)
    sims = f @ f.T
    np.fill_diagonal(sims, -np.inf)
    return float(np.mean(labels[np.argmax(sims, axis=1)] == labels))


CORES_STOPPED = [
    "method=cores",
    "scenario.tasks=[3,6]",
    "scenario.model_selection=true",
    "epochs=2",
    "run.name=stopped",
    "run.max_failures=0",
    "run.checkpoints_to_keep=5",
    "run.inject_failure={step: 1, epoch: 1, batch: 0, rank: 0}",
]


@pytest.fixture(scope="module")
def cores_run(ray_local, tmp_path_factory):
    """CoReS on 2 workers, two steps with model selection, run twice with the same command:
    the first attempt stops at an injected failure in step_2 (``run.max_failures=0``), the second
    resumes it. Returns ``(cfg, error of the first attempt, state.json after it, result)``."""
    path = tmp_path_factory.mktemp("cores")
    cfg = toy_config(path, *CORES_STOPPED)
    error = None
    try:
        run(cfg)
    except Exception as err:  # checked by test_a_stopped_run_resumes_with_the_same_command
        error = err
    state_file = Path(path) / "stopped" / "state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else None
    return cfg, error, state, run(toy_config(path, *CORES_STOPPED))


def test_cores_two_workers_matrix_matches_a_naive_recomputation(cores_run):
    cfg, _, _, result = cores_run
    matrix = result.matrix.as_array()
    assert matrix.shape == (2, 2) and matrix[0, 1] == 0
    run_path = Path(result.run_path)
    for name in ("compatibility.json", "state.json", "summary.json", "config.yaml", "plan.json"):
        assert (run_path / name).is_file(), name
    stored = json.loads((run_path / "compatibility.json").read_text())
    np.testing.assert_allclose(np.array(stored["rows"][1]), matrix[1, :2])

    # The diagonal from a fresh extraction with the exported model, scored by brute force.
    dataset = open_dataset(cfg.data)
    splits = make_splits(cfg, dataset.labels)
    images = torch.stack([dataset[int(r)][0] for r in splits.test])
    labels = dataset.labels[splits.test]
    for t, step in enumerate(["step_1", "step_2"]):
        model, info = load_exported_model(checkpoint_dir(result, step))
        assert info["step"] == step
        with torch.no_grad():
            features = model.forward_features(images).numpy()
        assert matrix[t, t] == pytest.approx(naive_identification(features, labels), abs=1e-6)

    # Model selection: the selected epoch is compatible with the previous model, or the best.
    chosen = result.metrics["step_2"]
    assert chosen["selection_score"] >= 0 and "val_cross_test" in chosen


@pytest.fixture(scope="module")
def ddp_run(ray_local, tmp_path_factory):
    """One uninterrupted DDP run on 2 workers, one step of 2 epochs: the reference the
    interrupted runs are compared with, and the checkpoint other tests read."""
    path = tmp_path_factory.mktemp("ddp_reference")
    cfg = toy_config(path, "scenario.tasks=[6]", "epochs=2", "run.name=ddp")
    return cfg, run(cfg)


def test_each_worker_trains_on_different_rows(ddp_run):
    cfg, result = ddp_run
    directory = Path(checkpoint_dir(result, "step_1"))
    rows = [set(np.load(directory / f"rows_rank{r}.npy").tolist()) for r in range(2)]
    plan = plan_steps(cfg)[0]
    dataset = open_dataset(cfg.data)
    new, _ = step_rows(plan, dataset.labels, make_splits(cfg, dataset.labels), cfg)
    assert rows[0] | rows[1] == set(new.tolist())
    assert len(rows[0] & rows[1]) <= 1  # only DistributedSampler-style padding may repeat


def test_unknown_dataset_path_fails_before_any_worker_starts(ray_local, tmp_path):
    cfg = toy_config(
        tmp_path,
        "data.name=cifar100",
        f"data.options={{root: {tmp_path}/nope}}",
        "model.num_classes=100",
    )
    with pytest.raises(FileNotFoundError, match="nope"):
        run(cfg)
    assert not (tmp_path / cfg.run.name).exists()


def test_a_worker_failure_resumes_from_the_last_checkpoint_ddp(ray_local, tmp_path, ddp_run):
    common = ["scenario.tasks=[6]", "epochs=2"]
    clean = ddp_run[1]  # the same config, uninterrupted
    failing = run(
        toy_config(
            tmp_path / "fail",
            *common,
            "run.name=fail",
            "run.inject_failure={step: 0, epoch: 1, batch: 2, rank: 1}",
        )
    )
    assert (tmp_path / "fail" / "fail" / "_injected_failure_step_1").exists()
    assert failing.metrics["step_1"]["epoch"] == clean.metrics["step_1"]["epoch"] == 1
    # The sampler loader is deterministic, so the resumed run retraces the clean one.
    np.testing.assert_allclose(failing.matrix.as_array(), clean.matrix.as_array(), atol=1e-6)


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_sharded_strategies_train_fail_and_restore_their_own_checkpoints(
    ray_local, tmp_path, strategy, ddp_run
):
    cfg = toy_config(
        tmp_path,
        "scenario.tasks=[6]",
        "epochs=2",
        f"scaling.strategy={strategy}",
        f"run.name={strategy}",
        "run.inject_failure={step: 0, epoch: 1, batch: 1, rank: 0}",
    )
    result = run(cfg)
    assert result.metrics["step_1"]["epoch"] == 1
    directory = Path(checkpoint_dir(result, "step_1"))
    header = json.loads((directory / "train_state" / "strategy.json").read_text())
    assert header["strategy"] == strategy and header["world_size"] == 2
    model, _ = load_exported_model(directory)  # the unsharded export is complete
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # Same maths as DDP (the strategies agree to 1e-5 in test_parallel), interrupted or not.
    np.testing.assert_allclose(result.matrix.as_array(), ddp_run[1].matrix.as_array(), atol=0.03)


def test_a_stopped_run_resumes_with_the_same_command(cores_run):
    _, error, state, result = cores_run
    assert error is not None and re.search("injected failure", str(error)), error
    run_path = Path(result.run_path)
    assert list(state["steps"]) == ["step_1"]
    # The same command passed the second time (the marker), skipping the finished step_1.
    assert result.checkpoints["step_1"].path == state["steps"]["step_1"]["checkpoint"]
    # step_2 restarted from its epoch-0 checkpoint: epochs 0 and 1 reported once each.
    assert len([p for p in (run_path / "step_2").glob("checkpoint_*") if p.is_dir()]) == 2
    assert result.matrix.as_array().shape == (2, 2)


CL2R_CONFIG = Path(__file__).parents[3] / "configs" / "train_synthetic_cl2r.yaml"
CL2R_OVERRIDES = [  # the config's method (dsimplex_hoc) and loader (ray_data) are kept
    *TOY[:3],
    "scenario.tasks=[3,3]",
    "epochs=1",
    "scenario.replay_per_class=5",
    "model.backbone_kwargs={in_chans: 1, image_size: 28}",
    "run.name=job",
]


@pytest.fixture(scope="module")
def cl2r_job_run(ray_local, tmp_path_factory):
    """``jobs/train.py`` on ``configs/train_synthetic_cl2r.yaml`` shrunk by overrides: CL2R with
    replay, read through Ray Data shards. Returns ``(cfg, summary, storage path)``."""
    import importlib.util

    path = Path(__file__).parents[3] / "jobs" / "train.py"
    spec = importlib.util.spec_from_file_location("train_job", path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    storage = tmp_path_factory.mktemp("cl2r_job")
    overrides = [*CL2R_OVERRIDES, f"run.storage_path={storage}"]
    summary = job.main(["--config", str(CL2R_CONFIG), *overrides])
    return load_config(TrainConfig, str(CL2R_CONFIG), overrides), summary, storage


def test_cl2r_with_replay_through_ray_data_shards(cl2r_job_run):
    cfg, summary, storage = cl2r_job_run
    assert (cfg.method, cfg.scenario.kind, cfg.data.loader) == ("dsimplex_hoc", "cl2r", "ray_data")
    assert np.array(summary["matrix"]).shape == (2, 2)
    state = json.loads((storage / "job" / "state.json").read_text())
    directory = Path(state["steps"]["step_2"]["checkpoint"])
    rows = [np.load(directory / f"rows_rank{r}.npy") for r in range(2)]
    dataset = open_dataset(cfg.data)
    plan = plan_steps(cfg)[1]
    new, replay = step_rows(plan, dataset.labels, make_splits(cfg, dataset.labels), cfg)
    new_seen = [set(r.tolist()) & set(new.tolist()) for r in rows]
    assert not new_seen[0] & new_seen[1]  # Ray Data gave each worker different rows
    assert (new_seen[0] | new_seen[1]) <= set(new.tolist())
    replayed = set(np.concatenate(rows).tolist()) & set(replay.tolist())
    assert replayed and set(dataset.labels[list(replayed)]) <= {0, 1, 2}


def test_iam_cl2r_replacement_model_continues_the_sequence(ray_local, tmp_path):
    cfg = toy_config(
        tmp_path,
        "method=dsimplex_hoc",
        "scenario.kind=iam_cl2r",
        "scenario.tasks=[2,2,2]",
        "model.num_classes=12",
        "epochs=1",
        "scaling.num_workers=1",  # not about workers: one start-up less per step
        "run.name=iam",
        "scenario.replacements=[{at_task: 2, pretrain_classes: [0, 1, 2, 3], "
        "model: {backbone: lenetpp, head: dsimplex, num_classes: 12}}]",
    )
    result = run(cfg)
    assert result.matrix.names == ["step_1", "step_2", "step_3"]
    assert "replacement_3" in result.checkpoints
    _, info = load_exported_model(checkpoint_dir(result, "step_3"))
    assert info["allocation"] == "rtl" and info["seen_outputs"][-2:] == [6, 7]  # 11 - y, y = 5, 4


@pytest.fixture(scope="module")
def s3_runs(s3_server):
    """``(bucket, storage_options)`` of an empty bucket on the session's moto server, for the
    module's shared run (conftest's ``s3_bucket`` is per test)."""
    import uuid

    import s3fs

    options = {"client_kwargs": {"endpoint_url": s3_server}}
    bucket = f"raycompat-test-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir(bucket)
    yield bucket, options
    fs.rm(bucket, recursive=True)


@pytest.fixture(scope="module")
def two_model_s3_run(ray_local, s3_server, s3_runs, cores_run, tmp_path_factory):
    """A two-model NIFCL upgrade of a given black-box old model (step_1 of ``cores_run``,
    trained from scratch on classes 0-2), with its run stored on S3."""
    bucket, _ = s3_runs
    weights = str(Path(checkpoint_dir(cores_run[3], "step_1")) / "model.safetensors")
    old = f"{{checkpoint: {weights}, classes: 3, access: black_box, model: {{num_classes: 6}}}}"
    cfg = toy_config(
        tmp_path_factory.mktemp("nifcl"),
        "method=nifcl_rw",
        "scenario.kind=two_model",
        "scenario.tasks=[3,6]",
        "epochs=1",
        "run.name=nifcl",
        f"scenario.old_model={old}",
        f"run.storage_path=s3://{bucket}/runs",
        f"run.endpoint_url={s3_server}",
    )
    return run(cfg)


def test_two_model_upgrade_with_a_given_black_box_old_model(cores_run, two_model_s3_run):
    first = cores_run[3]  # the run that trained the old model
    assert first.matrix.as_array().shape == (2, 2)
    result = two_model_s3_run
    # The given old model is not retrained: its self-test is the first run's.
    assert result.matrix.as_array()[0, 0] == pytest.approx(first.matrix.as_array()[0, 0])


def test_old_checkpoint_with_another_feature_width_is_rejected_before_training(
    ray_local, tmp_path, ddp_run
):
    first = ddp_run[1]  # a trained model of K=6 outputs: feature width 5
    weights = str(Path(checkpoint_dir(first, "step_1")) / "model.safetensors")
    old = f"{{checkpoint: {weights}, classes: 3, model: {{num_classes: 9}}}}"
    cfg = toy_config(
        tmp_path,
        "method=bct",
        "scenario.kind=two_model",
        "scenario.tasks=[3,6]",
        "run.name=wide",
        f"scenario.old_model={old}",
    )
    with pytest.raises(ValueError, match="feature width 8"):
        run(cfg)
    assert not (tmp_path / "wide").exists()


def test_runs_stored_on_s3(s3_runs, two_model_s3_run):
    import s3fs

    bucket, options = s3_runs
    result = two_model_s3_run
    fs = s3fs.S3FileSystem(**options)
    summary = json.loads(fs.cat(f"{bucket}/runs/nifcl/summary.json"))
    assert summary["matrix"] == result.matrix.as_array().tolist()
    # The given model trains nothing: one task evaluated it (no Ray Train run), once.
    given = f"{bucket}/runs/nifcl/step_1/checkpoint_evaluated"
    assert result.checkpoints["step_1"].path == given
    assert {p.rsplit("/", 1)[1] for p in fs.ls(given)} - {""} == {
        "model.safetensors",
        "model.json",
        "metrics.json",
        "val_features.npy",
        "test_features.npy",
    }
    lines = [json.loads(x) for x in fs.cat(f"{bucket}/runs/nifcl/metrics.jsonl").splitlines()]
    assert [(x["step"], x["epoch"]) for x in lines] == [("step_1", 0), ("step_2", 0)]


def test_jobs_train_main_runs_a_config_file_with_overrides(cl2r_job_run):
    _, summary, storage = cl2r_job_run
    assert len(summary["matrix"]) == 2 and 0 <= summary["AC"] <= 1
    assert (storage / "job" / "summary.json").is_file()


def test_a_non_finite_step_stops_the_run_once_and_keeps_the_last_good_checkpoint(
    ray_local, tmp_path
):
    from raycompat.engine import NonFiniteError

    cfg = toy_config(
        tmp_path,
        "scenario.tasks=[6]",
        "epochs=2",
        "run.name=diverged",
        "scaling.num_workers=1",
        "run.max_failures=2",  # a crashed worker would be retried twice; this error never is
        "run.inject_failure={step: 0, epoch: 1, batch: 1, rank: 0, kind: nan}",
    )
    with pytest.raises(NonFiniteError) as caught:
        run(cfg)
    message = str(caught.value)
    assert "\n" not in message
    run_path = tmp_path / "diverged"
    hits = list(run_path.glob("_injected_failure_step_1_nan_*"))
    assert len(hits) == 1, f"the step ran {len(hits)} times: Ray retried it"
    checkpoints = [p for p in (run_path / "step_1").glob("checkpoint_*") if p.is_dir()]
    assert len(checkpoints) == 1  # epoch 0's, kept
    state = json.loads((checkpoints[0] / "train_state" / "state.json").read_text())
    assert state["epoch"] == 0
    expected = (
        f"step_1: non-finite loss term 'loss' (nan) at epoch 1, step 1 "
        f"(global {state['global_step'] + 1}); lower optim.lr or set optim.clip_grad_norm"
    )
    assert message == expected
    model, info = load_exported_model(checkpoints[0])
    assert info["epoch"] == 0 and all(torch.isfinite(p).all() for p in model.parameters())
    assert not (run_path / "state.json").exists()  # written once a step has finished


def test_a_plateau_ends_the_run_before_its_cap_and_keeps_the_best_epoch(ray_local, tmp_path):
    """A learning rate too small to move the model: the validation score never improves, so
    patience 1 ends the run after its second epoch of a 6-epoch cap, keeping the first; a
    failure in that second epoch resumes with the rule's state and stops at the same place."""
    cfg = toy_config(
        tmp_path,
        "scenario.tasks=[4]",
        "scaling.num_workers=1",
        "optim.lr=1e-12",
        "epochs=6",
        "stop.rule=plateau",
        "stop.patience=1",
        "run.name=plateau",
        "run.max_failures=1",
        "run.inject_failure={step: 0, epoch: 1, batch: 0, rank: 0}",
    )
    result = run(cfg)
    (chosen,) = result.metrics.values()
    assert (chosen["epoch"], chosen["epochs_run"], chosen["stopped"]) == (0, 2, "plateau")
    assert chosen["selection_score"] == chosen["val_self_test"]
    lines = (tmp_path / "plateau" / "metrics.jsonl").read_text().splitlines()
    reports = [json.loads(line) for line in lines]
    assert [r["epoch"] for r in reports] == [0, 1]  # epoch 0 not trained again after the failure
    assert [r["epochs_cap"] for r in reports] == [6, 6] and reports[-1]["best_epoch"] == 0
