"""The per-worker function of one training step (Ray Train V2 ``train_loop_per_worker``).

Read top to bottom: open the data, build the step's model (initialised as the plan says) and its
compatibility method (with the parent step's model frozen as the old model), wrap both in the
parallel strategy, resume from ``ray.train.get_checkpoint()`` if there is one, then per epoch:
train on this rank's share, extract validation and test features (every rank, collectively),
score the epoch for model selection, and report a checkpoint holding the strategy's training
state, the exported model and the features. Rank 0 writes the shared files; under FSDP and
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
import uuid
from pathlib import Path

import numpy as np
import ray.train
import ray.train.torch
import torch

from raycompat.cluster.console import set_log_level
from raycompat.cluster.train.epoch_log import EpochClock, images_per_s, log_epoch
from raycompat.config.train import TrainConfig
from raycompat.engine import StepGuard
from raycompat.evaluation import EvalSet, score, selection_score
from raycompat.io.run_storage import exists, touch
from raycompat.io.weights import load_weights
from raycompat.methods import OldModel, create_method
from raycompat.parallel import create_strategy
from raycompat.train import schedule
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
from raycompat.train.scenarios import StepPlan

log = logging.getLogger(__name__)
TRAIN_STATE = "train_state"


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


def scaling_config(scaling) -> ray.train.ScalingConfig:
    """Ray Train's ScalingConfig from a run's ``scaling`` section (training and FCT runs)."""
    return ray.train.ScalingConfig(
        num_workers=scaling.num_workers,
        use_gpu=scaling.use_gpu,
        resources_per_worker={"CPU": scaling.cpus_per_worker},
        placement_strategy=scaling.placement_strategy,
    )


def maybe_fail(cfg: TrainConfig, index: int, epoch: int, batch: int, rank: int, marker) -> bool:
    """The ``run.inject_failure`` test hook (:class:`~raycompat.config.train.FailurePoint`):
    kind ``error`` raises once; returns True where kind ``nan`` wants this batch's loss NaN."""
    point = cfg.run.inject_failure
    if point is None or (point.step, point.epoch, point.batch, point.rank) != (
        index,
        epoch,
        batch,
        rank,
    ):
        return False
    fs, path = marker
    if point.kind == "nan":
        touch(fs, f"{path}_nan_{uuid.uuid4().hex}")  # one marker per hit: tests count attempts
        return True
    if not exists(fs, path):  # once per run: the marker survives the restart
        touch(fs, path)
        raise RuntimeError(f"injected failure at step {index} epoch {epoch} batch {batch}")
    return False


def train_loop_per_worker(config: dict) -> None:
    cfg: TrainConfig = config["cfg"]
    plans: list[StepPlan] = config["plans"]
    index: int = config["index"]
    set_log_level()  # RAYCOMPAT_VERBOSE=1 (a job's --verbose): our DEBUG lines too
    plan = plans[index]
    parent_plan = plans[plan.parent] if plan.parent is not None else None
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))

    dataset = open_dataset(cfg.data)
    labels = dataset.labels
    splits = make_splits(cfg, labels)
    new = replay = np.zeros(0, dtype=np.int64)
    if plan.epochs:  # a given or pre-trained model (0 epochs) is only evaluated
        new, replay = step_rows(plan, labels, splits, cfg)
    targets = targets_for(plan, labels)
    test_dataset, test_rows, _ = test_source(cfg, dataset, labels, splits)

    parent_dir = None
    if config["parent"] is not None:
        parent_dir = Path(tempfile.mkdtemp(prefix="raycompat-parent-"))
        config["parent"].to_directory(str(parent_dir))
    model = initial_model(cfg, plan, index, parent_dir).to(device)
    old = old_model(plan, parent_plan, parent_dir, device)
    options = cfg.method_options if plan.method == cfg.method else {}
    method = create_method(plan.method, old=old, **options).to(device)
    method.check_model(model)
    if plan.epochs:
        no_replay = np.zeros(0, np.int64)
        passes = sampler_batches(dataset, targets, new, no_replay, 256, 0, cfg.seed, 0, 1, "none")
        method.prepare(model, (batch for batch, _ in passes))

    per_worker = max(1, cfg.batch_size // world)
    prepared = create_strategy(cfg.scaling.strategy, **cfg.scaling.strategy_options).setup(
        model,
        schedule.optimizer_factory(cfg.optim),
        device,
        precision=cfg.scaling.precision if device.type == "cuda" else "fp32",
        channels_last=cfg.scaling.channels_last and device.type == "cuda",
    )

    start, global_step = 0, 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = prepared.load(os.path.join(directory, TRAIN_STATE))
        start = state["epoch"] + 1
        global_step = state.get("global_step", 0)  # absent from checkpoints of older versions
        log.info("%s: resumed after epoch %d", plan.name, start)

    # A torch optimizer steps after the guard's gradient check; DeepSpeed's engine owns its step
    # (and clips with strategy_options.gradient_clipping).
    optimizer = prepared.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = None
    guard = StepGuard(cfg.optim.clip_grad_norm, global_step, where=plan.name)
    epochs = range(start, plan.epochs) if plan.epochs else ([0] if checkpoint is None else [])
    clock = EpochClock(start, plan.epochs)
    for epoch in epochs:
        began, sums, steps, seen_rows = time.perf_counter(), {}, 0, []
        if plan.epochs:
            prepared.set_lr(schedule.lr_at(cfg.optim, epoch, plan.epochs))
            batches = batch_source(
                cfg, dataset, targets, new, replay, per_worker, epoch, rank, world
            )
            with guard.watch(prepared.model, optimizer):
                for batch, rows in guard.steps(batches, epoch):
                    poison = maybe_fail(cfg, index, epoch, guard.step, rank, config["marker"])
                    batch.images = prepared.prepare_inputs(batch.images)
                    batch.targets = batch.targets.to(device)
                    if batch.replay is not None:
                        batch.replay = batch.replay.to(device)
                    with prepared.autocast():
                        terms = method(prepared.module, batch)
                    if poison:
                        terms["loss"] = terms["loss"] * float("nan")
                    values = guard.check_terms(terms)
                    prepared.backward_step(terms["loss"])  # the guard checks the gradient norm
                    if optimizer is not None:
                        values["grad_norm"] = guard.grad_norm
                    for name, value in values.items():
                        sums[name] = sums.get(name, 0.0) + value
                    steps += 1
                    seen_rows.append(rows)
        trained_s = time.perf_counter() - began
        val = extract(prepared, dataset, splits.val, cfg.eval.batch_size, rank, world)
        test = extract(prepared, test_dataset, test_rows, cfg.eval.batch_size, rank, world)
        # Last line of defence (a step the guard cannot see, such as DeepSpeed's): never report
        # a model whose features are not finite.
        guard.check_tensors({"validation features": val, "test features": test})
        metrics = {
            "epoch": epoch,
            "global_step": guard.global_step,
            "steps": steps,
            "seconds": time.perf_counter() - began,
            # over all workers, from this rank's share (every rank runs as many steps)
            "images_per_s": images_per_s(world * sum(map(len, seen_rows)), trained_s),
            **{k: v / max(steps, 1) for k, v in sums.items()},
        }
        if len(splits.val):
            metrics.update(
                selection_metrics(cfg, plan, labels, splits.val, val, parent_plan, parent_dir)
            )
        if not cfg.scenario.model_selection:
            metrics["selection_score"] = float(epoch)
        report(cfg, plan, prepared, metrics, val, test, rank, seen_rows)
        if rank == 0 and plan.epochs:  # the console's one line per epoch (metrics.jsonl: all)
            loss_terms = {k: metrics[k] for k in sums if k != "grad_norm"}
            run_step = f"{cfg.run.name}/{plan.name}"
            log_epoch(log, run_step, epoch, plan.epochs, loss_terms, metrics["images_per_s"], clock)
    if parent_dir is not None:
        shutil.rmtree(parent_dir, ignore_errors=True)


def batch_source(cfg, dataset, targets, new, replay, per_worker, epoch, rank, world):
    if cfg.data.loader == "ray_data":
        from raycompat.cluster.train.ray_data import shard_batches

        return shard_batches(per_worker, len(replay) > 0, cfg.seed, epoch, rank)
    return sampler_batches(
        dataset, targets, new, replay, per_worker, epoch, cfg.seed, rank, world, cfg.data.augment
    )


def report(cfg, plan, prepared, metrics, val, test, rank, seen_rows) -> None:
    directory = tempfile.mkdtemp(prefix=f"raycompat-rank{rank}-")
    train_state = {"epoch": metrics["epoch"], "global_step": metrics["global_step"]}
    prepared.save(os.path.join(directory, TRAIN_STATE), train_state)
    state = prepared.full_state_dict()
    rows = np.concatenate(seen_rows) if seen_rows else np.zeros(0, np.int64)
    np.save(os.path.join(directory, f"rows_rank{rank}.npy"), rows)
    if rank == 0:
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
        save_features(directory, "val", val)
        save_features(directory, "test", test)
        Path(directory, "metrics.json").write_text(json.dumps(metrics, default=float))
    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))
    shutil.rmtree(directory, ignore_errors=True)
