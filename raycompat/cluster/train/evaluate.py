"""A step that trains nothing (a given old model, 0 epochs) evaluated by one Ray task.

Such a step only loads its model and extracts the validation and test features the next step
and the matrix need. A Ray Train run for it would start a controller and a worker group (two
fresh processes importing torch, a placement group, a process group: about 10 s of start-up
per run, measured, for a second of work); one task on the cluster does the same work in a
pooled worker. Read top to bottom: :func:`evaluate_step` (driver) sends :func:`_evaluate` to
the cluster with one training worker's resources; the task opens the step's data, builds the
model as a training worker would (:func:`~raycompat.cluster.train.loop.step_model`), lets
:class:`~raycompat.cluster.train.loop.ModelStep` score the untrained epoch and export it, and
copies the checkpoint directory to ``<run path>/<step>/checkpoint_evaluated``. The driver
appends the epoch's metrics to ``metrics.jsonl`` as the trained steps' callback does.

What differs from a Ray Train run: the model is evaluated in one process (no DDP/FSDP/
DeepSpeed wrapping: nothing is trained, and a given model comes as one file), and callbacks
added by a Tune sweep do not see this step (it reports no epoch to Tune).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import ray
import ray.train
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raycompat.cluster.train.epoch_log import METRICS_FILE
from raycompat.io import run_storage as storage

CHECKPOINT_DIR = "checkpoint_evaluated"


def evaluate_step(cfg, plans, index: int, parent, fs, run_path: str):
    """``(checkpoint, metrics)`` of untrained step ``plans[index]``, its checkpoint stored at
    ``<run_path>/<step>/checkpoint_evaluated`` (the same files a Ray Train run's would hold)."""
    plan, scaling = plans[index], cfg.scaling
    task = ray.remote(_evaluate).options(
        num_cpus=scaling.cpus_per_worker,
        num_gpus=1 if scaling.use_gpu else 0,
        # not inside a Tune trial's placement group: its bundle holds only the trial itself
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=None),
    )
    destination = f"{run_path}/{plan.name}/{CHECKPOINT_DIR}"
    metrics = ray.get(task.remote(cfg, plans, index, parent, fs, destination))
    line = json.dumps({"step": plan.name, **metrics}, default=float)
    storage.append_line(fs, f"{run_path}/{METRICS_FILE}", line)
    return ray.train.Checkpoint(destination, filesystem=fs), metrics


def _evaluate(cfg, plans, index: int, parent, fs, destination: str) -> dict:
    import torch

    from raycompat.cluster.console import set_log_level
    from raycompat.cluster.train.loop import ModelStep, open_step_data, step_model
    from raycompat.cluster.train.worker import EpochTraining, prepare_model
    from raycompat.engine import StepGuard

    set_log_level()
    use_gpu = cfg.scaling.use_gpu and torch.cuda.is_available()
    device = torch.device("cuda" if use_gpu else "cpu")
    work = Path(tempfile.mkdtemp(prefix="raycompat-evaluate-"))
    try:
        parent_dir = None
        if parent is not None:
            parent_dir = work / "parent"
            parent.to_directory(str(parent_dir))
        data = open_step_data(cfg, plans[index])
        model, method = step_model(cfg, plans, index, data, parent_dir, device)
        prepared = prepare_model(model, cfg, device, strategy="ddp")  # one process: plain
        step = ModelStep(cfg, plans, index, data, method, parent_dir, prepared, 0, 1)
        guard = StepGuard(None, 0, where=step.where)
        metrics = step.epoch_metrics(EpochTraining(0, time.perf_counter()), guard)
        out = work / "checkpoint"
        out.mkdir()
        step.export(str(out), prepared.full_state_dict(), metrics)
        storage.replace_dir(fs, str(out), destination)
        return metrics
    finally:
        shutil.rmtree(work, ignore_errors=True)
