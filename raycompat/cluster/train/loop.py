"""The per-worker function of one training step (Ray Train V2 ``train_loop_per_worker``).

Read top to bottom: open the data, build the step's model (initialised as the plan says) and its
compatibility method (with the parent step's model frozen as the old model), then hand a
:class:`ModelStep` to the shared skeleton (:mod:`raycompat.cluster.train.worker`: parallel
strategy, resume from the session's checkpoint, the epoch loop). Per epoch the step trains
on this rank's share, extracts validation and test features (every rank, collectively), scores
the epoch for model selection, and reports a checkpoint holding the strategy's training state,
the exported model and the features. Rank 0 writes the shared files; under FSDP and
DeepSpeed every rank writes its own shard.

Every step runs under a :class:`~raycompat.engine.StepGuard`: features, loss terms and the
gradient norm are checked (and the norm clipped to ``optim.clip_grad_norm``); a NaN/inf raises
``NonFiniteError`` before the epoch reports, so the last good checkpoint stays the latest, and
the driver stops the run without Ray's retries (:mod:`raycompat.cluster.train.guard`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from raycompat.cluster.console import set_log_level
from raycompat.cluster.train import session
from raycompat.cluster.train.epoch_log import images_per_s
from raycompat.cluster.train.worker import EpochTraining, WorkerTask, setup_worker, train_worker
from raycompat.config.train import TrainConfig
from raycompat.engine import StepGuard
from raycompat.evaluation import EvalSet, score, selection_score
from raycompat.io.weights import load_weights
from raycompat.methods import OldModel, create_method
from raycompat.train.data import (
    extract,
    make_splits,
    open_dataset,
    sampler_batches,
    step_rows,
    targets_for,
    test_source,
)
from raycompat.train.export import (
    build_model,
    export_model,
    load_exported_model,
    load_features,
    save_features,
)
from raycompat.train.loader import BatchLoader, loader_workers
from raycompat.train.scenarios import StepPlan
from raycompat.train.stopping import Plateau

log = logging.getLogger(__name__)
# How loader processes start in a Ray worker (Ray Train's advice: not fork, whose child
# inherits the locks of the worker's threads)
START_METHOD = "forkserver"


def initial_model(cfg: TrainConfig, plan: StepPlan, index: int, parent_dir: Path | None):
    """The plan's model before training: same seed, fresh seed, or the parent's weights."""
    torch.manual_seed(cfg.seed if plan.init == "same_seed" else cfg.seed + 1 + index)
    model = build_model(plan.model)
    if plan.init == "previous" and parent_dir is not None:
        parent, _ = load_exported_model(parent_dir)
        model.load_state_dict(parent.state_dict())
    elif plan.given is not None:
        load_weights(model, plan.given.checkpoint)
    elif plan.model.weights:
        load_weights(model, plan.model.weights)
    return model


def old_model(plan: StepPlan, parent_plan: StepPlan | None, parent_dir: Path | None, device):
    if parent_dir is None:
        return None
    model, info = load_exported_model(parent_dir)
    model.to(device)
    access = parent_plan.given.access if parent_plan.given else "with_classifier"
    if access == "black_box":
        return OldModel.black_box(model.forward_features, model.embed_dim)
    return OldModel.from_model(
        model, classes=info["seen_outputs"], with_classifier=access == "with_classifier"
    )


def selection_metrics(cfg, plan, labels, val_rows, val, parent_plan, parent_dir) -> dict:
    """Self-test on the classes seen so far and ECC against the parent on its classes (val)."""
    protocol = "identification" if cfg.eval.protocol == "verification" else cfg.eval.protocol
    seen = np.isin(labels[val_rows], plan.seen_classes)
    self_test = score(protocol, val[seen], val[seen], EvalSet(labels[val_rows][seen]))
    metrics = {"val_self_test": self_test}
    cross = old_self = None
    if parent_dir is not None and plan.in_matrix and parent_plan.in_matrix:
        old_val = torch.from_numpy(load_features(parent_dir, "val"))
        rows = np.isin(labels[val_rows], parent_plan.seen_classes)
        old_set = EvalSet(labels[val_rows][rows])
        cross = score(protocol, val[rows], old_val[rows], old_set)
        old_self = score(protocol, old_val[rows], old_val[rows], old_set)
        metrics.update(val_cross_test=cross, val_old_self_test=old_self)
    value, ecc = selection_score(self_test, cross, old_self, cfg.eval.strict_ecc)
    metrics.update(ecc=ecc, selection_score=value)
    return metrics


@dataclass
class StepData:
    """One scenario step's images: the dataset and its splits, this step's new and replay rows
    and training targets, and the test images (``open_step_data``)."""

    dataset: object
    labels: np.ndarray
    splits: object
    new: np.ndarray
    replay: np.ndarray
    targets: np.ndarray
    test_dataset: object
    test_rows: np.ndarray


def open_step_data(cfg: TrainConfig, plan: StepPlan) -> StepData:
    dataset = open_dataset(cfg.data)
    labels = dataset.labels
    splits = make_splits(cfg, labels)
    new = replay = np.zeros(0, dtype=np.int64)
    if plan.epochs:  # a given or pre-trained model (0 epochs) is only evaluated
        new, replay = step_rows(plan, labels, splits, cfg)
    targets = targets_for(plan, labels)
    test_dataset, test_rows, _ = test_source(cfg, dataset, labels, splits)
    return StepData(dataset, labels, splits, new, replay, targets, test_dataset, test_rows)


def step_model(cfg, plans, index: int, data: StepData, parent_dir: Path | None, device):
    """``(model, method)`` of the step: the initial model and its compatibility method, the
    parent's model frozen as the old one, prepared on the step's new rows."""
    plan = plans[index]
    parent_plan = plans[plan.parent] if plan.parent is not None else None
    model = initial_model(cfg, plan, index, parent_dir).to(device)
    old = old_model(plan, parent_plan, parent_dir, device)
    options = cfg.method_options if plan.method == cfg.method else {}
    method = create_method(plan.method, old=old, **options).to(device)
    method.check_model(model)
    if plan.epochs:
        no_replay = np.zeros(0, np.int64)
        passes = sampler_batches(
            data.dataset, data.targets, data.new, no_replay, 256, 0, cfg.seed, 0, 1, "none"
        )
        method.prepare(model, (batch for batch, _ in passes))
    return model, method


def train_loop_per_worker(config: dict) -> None:
    cfg: TrainConfig = config["cfg"]
    plans: list[StepPlan] = config["plans"]
    index: int = config["index"]
    set_log_level()  # RAYCOMPAT_VERBOSE=1 (a job's --verbose): our DEBUG lines too
    device = session.current().device()
    torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))
    data = open_step_data(cfg, plans[index])
    parent_dir = None
    if config["parent"] is not None:
        parent_dir = Path(tempfile.mkdtemp(prefix="raycompat-parent-"))
        config["parent"].to_directory(str(parent_dir))
    model, method = step_model(cfg, plans, index, data, parent_dir, device)
    prepared, rank, world = setup_worker(model, cfg, cfg.scaling.channels_last)
    task = ModelStep(cfg, plans, index, data, method, parent_dir, prepared, rank, world)
    train_worker(task, prepared, cfg, rank, config["marker"])
    if parent_dir is not None:
        shutil.rmtree(parent_dir, ignore_errors=True)


class ModelStep(WorkerTask):
    """A scenario step's model: its compatibility method's loss on this rank's share of the
    step's rows, every step guarded; each epoch extracts validation and test features (every
    rank, collectively) and scores the epoch for model selection."""

    checked = True

    def __init__(self, cfg, plans, index, data, method, parent_dir, prepared, rank, world):
        self.cfg, self.plan, self.data, self.method = cfg, plans[index], data, method
        self.parent_plan = plans[self.plan.parent] if self.plan.parent is not None else None
        self.parent_dir, self.prepared, self.rank, self.world = parent_dir, prepared, rank, world
        self.name, self.where = f"{cfg.run.name}/{self.plan.name}", self.plan.name
        self.epochs, self.failure_step = self.plan.epochs, index
        self.plateau = Plateau.of(cfg.stop)  # None: every epoch of the cap runs
        workers = loader_workers(cfg.data.num_loader_workers, cfg.scaling.cpus_per_worker)
        if rank == 0:
            log.info(
                "%s: %d loader worker(s) per training worker (data.num_loader_workers%s)",
                self.name,
                workers,
                "" if cfg.data.num_loader_workers is not None else ": all CPUs but one",
            )
        device = prepared.device
        self.loader = BatchLoader(data.dataset, cfg.data.augment, workers, device, START_METHOD)
        self.test_loader = self.loader
        if data.test_dataset is not data.dataset:
            self.test_loader = BatchLoader(data.test_dataset, "none", workers, device, START_METHOD)

    def batches(self, epoch: int):
        cfg, data = self.cfg, self.data
        per_worker = max(1, cfg.batch_size // self.world)
        if cfg.data.loader == "ray_data":
            from raycompat.cluster.train.ray_data import shard_batches

            batches = shard_batches(per_worker, len(data.replay) > 0, cfg.seed, epoch, self.rank)
        else:
            batches = sampler_batches(
                data.dataset,
                data.targets,
                data.new,
                data.replay,
                per_worker,
                epoch,
                cfg.seed,
                self.rank,
                self.world,
                cfg.data.augment,
                self.loader,
            )
        return batches, None  # lr per epoch

    def loss(self, batch, poison: bool):
        prepared = self.prepared
        batch.images = prepared.prepare_inputs(batch.images)
        batch.targets = batch.targets.to(prepared.device)
        if batch.replay is not None:
            batch.replay = batch.replay.to(prepared.device)
        with prepared.autocast():
            terms = self.method(prepared.module, batch)
        if poison:
            terms["loss"] = terms["loss"] * float("nan")
        return terms["loss"], terms

    def epoch_metrics(self, trained: EpochTraining, guard: StepGuard) -> dict:
        cfg, data, prepared, rank, world = self.cfg, self.data, self.prepared, self.rank, self.world
        batch = cfg.eval.batch_size
        self.val = extract(prepared, data.dataset, data.splits.val, batch, rank, world, self.loader)
        self.test = extract(
            prepared, data.test_dataset, data.test_rows, batch, rank, world, self.test_loader
        )
        # Last line of defence (a step the guard cannot see, such as DeepSpeed's): never report
        # a model whose features are not finite.
        guard.check_tensors({"validation features": self.val, "test features": self.test})
        metrics = {
            "epoch": trained.epoch,
            "global_step": guard.global_step,
            "steps": trained.steps,
            "seconds": time.perf_counter() - trained.began,
            # over all workers, from this rank's share (every rank runs as many steps)
            "images_per_s": images_per_s(world * trained.trained_rows(), trained.trained_s),
            **{k: v / max(trained.steps, 1) for k, v in trained.sums.items()},
        }
        if len(data.splits.val):
            metrics.update(
                selection_metrics(
                    cfg,
                    self.plan,
                    data.labels,
                    data.splits.val,
                    self.val,
                    self.parent_plan,
                    self.parent_dir,
                )
            )
        if not cfg.scenario.model_selection:
            # the validation self-test under a plateau rule (the best is kept), else the epoch
            by_val = self.plateau is not None and "val_self_test" in metrics
            metrics["selection_score"] = float(
                metrics["val_self_test"] if by_val else trained.epoch
            )
        return metrics

    def save_shard(self, directory: str, rank: int, trained: EpochTraining) -> None:
        rows = np.concatenate(trained.rows) if trained.rows else np.zeros(0, np.int64)
        np.save(os.path.join(directory, f"rows_rank{rank}.npy"), rows)

    def export(self, directory: str, state: dict, metrics: dict) -> None:
        plan = self.plan
        export_model(
            directory,
            state,
            plan.model,
            step=plan.name,
            allocation=plan.allocation,
            seen_outputs=plan.seen_outputs,
            label_map={str(c): o for c, o in plan.label_map.items()},
            epoch=metrics["epoch"],
        )
        save_features(directory, "val", self.val)
        save_features(directory, "test", self.test)
        Path(directory, "metrics.json").write_text(json.dumps(metrics, default=float))
