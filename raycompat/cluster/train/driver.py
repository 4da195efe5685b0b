"""The training driver: one ``TorchTrainer`` per planned step, and the growing compatibility matrix.

``run_training(cfg)`` checks everything it can before any worker starts (dataset present, class
counts fit K, an old checkpoint's width, replacement heads), then for each step of the scenario
builds a Ray Train V2 ``TorchTrainer`` whose run is named after the step and stored under
``<storage_path>/<run name>/`` (a step that trains nothing, such as a given old model, is
evaluated by one Ray task instead: :mod:`raycompat.cluster.train.evaluate`). After a step it
picks the checkpoint (the last epoch, or the CoReS model-selection winner), adds the model's
row to the compatibility matrix from the stored test features, and records both in
``state.json``.

Running the same command again resumes: finished steps are read back from ``state.json``, and an
interrupted step's trainer restores its latest checkpoint (same run name and storage path).
A worker error is retried ``run.max_failures`` times, except a non-finite step
(``NonFiniteError``), which stops the run at once (:mod:`raycompat.cluster.train.guard`).
Tune wraps this function (Train V2 pattern: the Tuner runs the driver, never ``Tuner(trainer)``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np
import ray
import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig
from ray.train.torch import TorchTrainer

from raycompat.cluster.console import train_logging_config
from raycompat.cluster.train import guard, task_run
from raycompat.cluster.train.epoch_log import METRICS_FILE, MetricsLog
from raycompat.cluster.train.evaluate import evaluate_step
from raycompat.cluster.train.loop import train_loop_per_worker
from raycompat.cluster.train.worker import report_polling, scaling_config
from raycompat.config import dump_config
from raycompat.config.checks import check_unseen
from raycompat.config.train import TrainConfig
from raycompat.errors import ConfigError
from raycompat.evaluation import EvalSet, grow_matrix, matrix_row
from raycompat.io import run_storage as storage
from raycompat.io.weights import load_state_dict, load_state_dict_into
from raycompat.methods.catalog import check_method_options
from raycompat.metrics.compatibility import (
    CompatibilityMatrix,
    average_accuracy,
    average_compatibility,
    average_compatibility_accuracy,
)
from raycompat.parallel import create_strategy
from raycompat.train.data import (
    make_splits,
    open_dataset,
    step_rows,
    targets_for,
    test_source,
)
from raycompat.train.export import build_model, load_features
from raycompat.train.scenarios import StepPlan, describe, plan_steps

log = logging.getLogger(__name__)


@dataclass
class TrainingResult:
    matrix: CompatibilityMatrix
    checkpoints: dict[str, ray.train.Checkpoint]  # step name -> selected checkpoint
    metrics: dict[str, dict]  # step name -> the selected epoch's metrics
    run_path: str
    val_matrix: CompatibilityMatrix | None = None  # on the validation split, for sweeps

    def summary(self) -> dict:
        out = {
            "run_path": self.run_path,
            "epochs": {k: v.get("epoch") for k, v in self.metrics.items()},
            **matrix_summary(self.matrix),
        }
        if self.val_matrix is not None:
            out["val"] = matrix_summary(self.val_matrix)
        return out


def matrix_summary(matrix: CompatibilityMatrix) -> dict:
    """The matrix with its names, and AC/AA/ACA once there are two models."""
    out = {"matrix": matrix.as_array().tolist(), "names": matrix.names}
    if len(matrix) > 1:
        out.update(
            AC=average_compatibility(matrix),
            AA=average_accuracy(matrix),
            ACA=average_compatibility_accuracy(matrix),
        )
    return out


def preflight(cfg: TrainConfig, plans: list[StepPlan], labels: np.ndarray, splits) -> None:
    """Fail fast, before any worker or GPU time: options known, labels fit, old model width."""
    check_method_options(cfg.method, cfg.method_options)
    check_clipping(cfg)
    for plan in plans:
        check_unseen(cfg, list(plan.classes) + list(plan.replay_classes), f"scenario: {plan.name}")
    for plan in plans:
        if not plan.given and plan.epochs:
            step_rows(plan, labels, splits, cfg)
    for plan in plans:
        if plan.given is not None:
            check_given_model(plan)


def check_clipping(cfg: TrainConfig) -> None:
    """``optim.clip_grad_norm`` clips between backward and the optimizer step, which a strategy
    that clips itself (DeepSpeed's engine: ``gradient_clipping``) keeps to itself."""
    strategy = create_strategy(cfg.scaling.strategy, **cfg.scaling.strategy_options)
    if cfg.optim.clip_grad_norm is not None and hasattr(strategy, "gradient_clipping"):
        raise ConfigError(
            f"optim.clip_grad_norm: the {cfg.scaling.strategy} strategy clips gradients itself; "
            "set scaling.strategy_options.gradient_clipping instead"
        )


def check_given_model(plan: StepPlan) -> None:
    spec, source = plan.given.model, plan.given.checkpoint
    if not source:
        raise ValueError("scenario.old_model.checkpoint: no path given")
    model = build_model(spec)
    state = load_state_dict(source)
    try:
        load_state_dict_into(model, state, source=source)
    except ValueError as err:
        raise ValueError(
            f"scenario.old_model: the checkpoint {source} does not match the configured old "
            f"model ({spec.backbone}, {spec.head}, K={spec.num_classes}, feature width "
            f"{model.embed_dim}): {err}"
        ) from err


def train_step(cfg: TrainConfig, plans, index, parent, fs, run_path, datasets, callbacks):
    """``(checkpoint, metrics)`` selected from training step ``plans[index]``: in one task
    (:mod:`raycompat.cluster.train.task_run`) where the run allows, else on Ray Train."""
    if task_run.runs_in_task(cfg.scaling, datasets, callbacks):
        keep = task_run.Keep(cfg.run.checkpoints_to_keep, "selection_score")
        config = loop_config(cfg, plans, index, parent, fs, run_path)
        name = plans[index].name
        loop = train_loop_per_worker
        result = task_run.fit_in_task(loop, config, cfg, fs, run_path, name, keep, callbacks or ())
    else:
        trainer = make_trainer(cfg, plans, index, parent, fs, run_path, datasets, callbacks)
        with report_polling(cfg.run):
            result = guard.fit(trainer)
    return select_checkpoint(result)


def loop_config(cfg: TrainConfig, plans, index, parent, fs, run_path) -> dict:
    """What :func:`~raycompat.cluster.train.loop.train_loop_per_worker` gets."""
    marker = (fs, f"{run_path}/_injected_failure_{plans[index].name}")
    return {"cfg": cfg, "plans": plans, "index": index, "parent": parent, "marker": marker}


def make_trainer(
    cfg: TrainConfig, plans, index, parent, fs, run_path, datasets, callbacks=None
) -> TorchTrainer:
    plan = plans[index]
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config(cfg, plans, index, parent, fs, run_path),
        scaling_config=scaling_config(cfg.scaling),
        run_config=RunConfig(
            name=plan.name,
            storage_path=run_path,
            storage_filesystem=fs,
            failure_config=FailureConfig(max_failures=cfg.run.max_failures),
            callbacks=[
                *(callbacks or []),
                guard.StopOnNonFinite(),
                MetricsLog(fs, f"{run_path}/{METRICS_FILE}", plan.name),
            ],
            logging_config=train_logging_config(),  # Ray Train's INFO lines: --verbose only
            checkpoint_config=CheckpointConfig(
                num_to_keep=cfg.run.checkpoints_to_keep,
                checkpoint_score_attribute="selection_score",
                checkpoint_score_order="max",
            ),
        ),
        datasets=datasets,
    )


def ray_datasets(cfg: TrainConfig, plan: StepPlan, labels: np.ndarray, splits) -> dict | None:
    if cfg.data.loader != "ray_data" or not plan.epochs or plan.given:
        return None
    from raycompat.cluster.train.ray_data import decode_pool_size, rows_dataset

    new, replay = step_rows(plan, labels, splits, cfg)
    targets = targets_for(plan, labels).numpy()
    scaling = cfg.scaling
    cpus = ray.cluster_resources().get("CPU", 1.0)
    held = scaling.num_workers * scaling.cpus_per_worker
    if cpus - held < 1 + bool(len(replay)):
        log.warning(
            "%s: data.loader=ray_data decodes in actors of 1 CPU each, but the training workers "
            "hold %g of the cluster's %g CPUs: the run waits until the cluster has more "
            "(or lower scaling.cpus_per_worker, or use data.loader=sampler)",
            plan.name,
            held,
            cpus,
        )
    actors = cfg.data.decode_actors
    if actors is None:
        actors = decode_pool_size(cpus, scaling.num_workers, scaling.cpus_per_worker)
    log.info(
        "%s: up to %d Ray Data decode actor(s) (data.decode_actors%s)",
        plan.name,
        actors,
        "" if cfg.data.decode_actors is not None else ": every CPU the workers do not hold",
    )
    out = {"train": rows_dataset(cfg.data, new, targets, cfg.seed, actors)}
    if len(replay):
        # one actor: the replay rows are few, and a second growing pool could hold the CPUs the
        # train pool's first actor waits for
        out["replay"] = rows_dataset(cfg.data, replay, targets, cfg.seed + 1, 1)
    return out


def select_checkpoint(result) -> tuple[ray.train.Checkpoint, dict]:
    """The kept checkpoint with the highest ``selection_score`` (the last epoch unless CoReS
    model selection or a plateau rule is on), its metrics carrying how the run ended (its last
    report's ``epochs_run`` and ``stopped``: a plateau, or the epoch cap)."""
    candidates = result.best_checkpoints or [(result.checkpoint, result.metrics)]
    checkpoint, metrics = max(candidates, key=lambda pair: pair[1]["selection_score"])
    last = result.metrics or {}
    ended = {key: last[key] for key in ("epochs_run", "stopped") if key in last}
    return checkpoint, {**metrics, **ended}


def features_of(checkpoint: ray.train.Checkpoint, name: str) -> np.ndarray:
    with checkpoint.as_directory() as directory:
        return load_features(directory, name)


class MatrixBuilder:
    """The compatibility matrix of one split, grown one model at a time from stored features."""

    def __init__(self, protocol: str, eval_set, distance: str, split: str) -> None:
        self.protocol, self.eval_set, self.distance, self.split = (
            protocol,
            eval_set,
            distance,
            split,
        )
        self.features: list[np.ndarray] = []
        self.matrix: CompatibilityMatrix | None = None

    def add(self, name: str, checkpoint: ray.train.Checkpoint) -> list[float]:
        features = features_of(checkpoint, self.split)
        row = matrix_row(self.protocol, features, self.features, self.eval_set, self.distance)
        self.features.append(features)
        self.matrix = grow_matrix(self.matrix, row, name, self.protocol)
        return row


def matrix_builders(cfg: TrainConfig, dataset, splits) -> dict[str, MatrixBuilder]:
    """Test matrix (the reported one) and, with a validation split, the validation matrix that
    sweeps and model selection may look at (never the test split). Opens ``eval.dataset``, so
    a missing one fails here, before training."""
    labels = dataset.labels
    _, _, test_set = test_source(cfg, dataset, labels, splits)
    builders = {"test": MatrixBuilder(cfg.eval.protocol, test_set, cfg.eval.distance, "test")}
    if len(splits.val):
        builders["val"] = MatrixBuilder(*val_evaluation(cfg, labels, splits), "val")
    return builders


def val_evaluation(cfg: TrainConfig, labels: np.ndarray, splits) -> tuple[str, EvalSet, str]:
    """``(protocol, eval set, distance)`` of the validation split: 1:N identification among
    its own images (verification pairs exist only for the test split)."""
    protocol = "identification" if cfg.eval.protocol == "verification" else cfg.eval.protocol
    return protocol, EvalSet(labels[splits.val]), cfg.eval.distance


def _state(fs, run_path: str) -> dict:
    """The run's ``state.json``: the steps a previous run finished (none for a new run)."""
    return storage.read_json(fs, f"{run_path}/state.json") or {"steps": {}}


def trained_already(cfg: TrainConfig) -> bool:
    """Whether an earlier run of ``cfg`` finished every planned step, so that
    :func:`run_training` would only read them back (a resumed upgrade says so instead of
    announcing the training it skips)."""
    fs, base = storage.run_filesystem(cfg.run)
    done = _state(fs, f"{base}/{cfg.run.name}")["steps"]
    return all(plan.name in done for plan in plan_steps(cfg))


def run_training(cfg: TrainConfig, callbacks: list | None = None) -> TrainingResult:
    """Train every planned model (resuming what a previous run finished); see the module doc.

    ``callbacks``: Ray Train callbacks added to every step's trainer (a sweep adds Tune's
    ``TuneReportCallback``, which forwards each epoch's report, and the placement-group reaper);
    a step of one worker still trains in one task when every callback can follow a task's
    reports (:func:`raycompat.cluster.train.task_run.runs_in_task`).
    """
    plans = plan_steps(cfg)
    dataset = open_dataset(cfg.data)  # a missing path raises FileNotFoundError naming it
    splits = make_splits(cfg, dataset.labels)
    preflight(cfg, plans, dataset.labels, splits)
    builders = matrix_builders(cfg, dataset, splits)
    fs, base = storage.run_filesystem(cfg.run)
    run_path = f"{base}/{cfg.run.name}"
    fs.create_dir(run_path, recursive=True)
    state = _state(fs, run_path)
    config = dump_config(cfg)  # credentials redacted
    storage.write_bytes(fs, f"{run_path}/config.yaml", config.encode())
    storage.write_json(fs, f"{run_path}/plan.json", describe(plans))

    checkpoints, metrics = {}, {}
    for index, plan in enumerate(plans):
        done = state["steps"].get(plan.name)
        parent = checkpoints[plans[plan.parent].name] if plan.parent is not None else None
        if done is not None:
            checkpoint = ray.train.Checkpoint(done["checkpoint"], filesystem=fs)
            chosen = done["metrics"]
            log.info("%s: already trained (%s), skipping", plan.name, done["checkpoint"])
        elif not plan.epochs:  # nothing to train: one task evaluates the given model
            checkpoint, chosen = evaluate_step(cfg, plans, index, parent, fs, run_path)
        else:
            datasets = ray_datasets(cfg, plan, dataset.labels, splits)
            checkpoint, chosen = train_step(
                cfg, plans, index, parent, fs, run_path, datasets, callbacks
            )
        checkpoints[plan.name], metrics[plan.name] = checkpoint, chosen
        if plan.in_matrix:
            rows = {split: b.add(plan.name, checkpoint) for split, b in builders.items()}
            log.debug(  # compatibility.json has it; the console keeps one line per stage
                "%s row of the compatibility matrix: %s",
                plan.name,
                " ".join(f"{v:.4f}" for v in rows["test"]),
            )
        state["steps"][plan.name] = {"checkpoint": checkpoint.path, "metrics": chosen}
        storage.write_json(fs, f"{run_path}/state.json", state)
        for split, builder in builders.items():
            name = "compatibility.json" if split == "test" else f"compatibility_{split}.json"
            storage.write_json(fs, f"{run_path}/{name}", json.loads(builder.matrix.to_json()))
    val = builders.get("val")
    result = TrainingResult(
        builders["test"].matrix, checkpoints, metrics, run_path, val.matrix if val else None
    )
    storage.write_json(fs, f"{run_path}/summary.json", result.summary())
    return result
