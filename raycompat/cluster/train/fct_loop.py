"""Ray Train runs for the FCT pieces (Ramanujan et al., CVPR 2022): psi at old time, h (and g)
at upgrade time.

- :func:`train_side_info`: SimCLR on unlabelled images (two ``simclr_views`` per image,
  NT-Xent), the side-information model ``psi`` of FCT sec. 3.4.
- :func:`compute_triples` (:mod:`raycompat.fct.triples`): ``(phi_old, psi, phi_new)`` of
  the new training set, in process.
- :func:`train_transformation`: ``h(phi_old, psi) -> phi_new`` by MSE (FCT sec. 3.3), and
  optionally ``g(phi_old, psi_old) -> psi_new`` (sec. 4.3), with appendix D's schedule: linear
  warm-up then cosine, evaluated per step; BN running statistics frozen from epoch
  ``epochs // 2`` on (the paper's "at epoch 40" of 80). With ``h.uncertainty`` set, ``h`` also
  learns FastFill's per-row uncertainty with the uncertainty-weighted loss (Jaeckle et al.,
  ICLR 2023; :func:`~raycompat.fct.losses.uncertain_transformation_loss`), plus its
  discriminative term when ``classifier`` names the new model.

Both are Ray Train V2 ``TorchTrainer`` runs stored under ``<run.storage_path>/<run.name>/``:
everything is checked before a worker starts, each worker trains on a different seeded shard of
the rows (DistributedSampler-style), wrapped by a :mod:`raycompat.parallel` strategy, and every
epoch reports a checkpoint holding the strategy state plus the exported pieces
(``side_info.*``, see :mod:`raycompat.fct.export`, or ``h.*``/``g.*``, see
:mod:`raycompat.transformations.files`). Rerunning the same
config resumes from the latest checkpoint; failed workers restart from it.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import ray.train
import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig
from ray.train.torch import TorchTrainer

from raycompat.cluster.console import set_log_level, train_logging_config
from raycompat.cluster.train import interrupt, task_run
from raycompat.cluster.train.epoch_log import METRICS_FILE, MetricsLog, images_per_s
from raycompat.cluster.train.worker import (
    EpochTraining,
    WorkerTask,
    report_polling,
    scaling_config,
    setup_worker,
    train_worker,
)
from raycompat.config import dump_config
from raycompat.config.fct import SideInfoTrainConfig, TransformationTrainConfig
from raycompat.data import create_dataset
from raycompat.fct.checks import (
    check_side_info_config,
    check_transformation_config,
    image_rows,
)
from raycompat.fct.export import export_side_info, load_side_info
from raycompat.fct.losses import freeze_batchnorm_statistics, transformation_loss
from raycompat.fct.pair import build_transformations, fixed_classifier, g_dims, uncertain_h_terms
from raycompat.fct.triples import Triples, compute_triples
from raycompat.io import run_storage as storage
from raycompat.nn.side_info import create_side_info, nt_xent_loss, simclr_views
from raycompat.train.data import load_images, rank_share
from raycompat.transformations import export_transformation

log = logging.getLogger(__name__)

__all__ = [
    "compute_triples",
    "load_side_info",
    "train_side_info",
    "train_transformation",
]


class FCTTask(WorkerTask):
    """What the two FCT runs share: seeded per-rank shards of ``rows`` in full batches
    (``drop_last``: NT-Xent and BatchNorm want full batches), the lr per step."""

    def __init__(self, cfg, kind: str, prepared, rows: np.ndarray, rank: int, world: int):
        self.cfg, self.prepared, self.rows, self.rank, self.world = cfg, prepared, rows, rank, world
        self.name, self.epochs = f"{cfg.run.name}/{kind}", cfg.epochs
        self.per_worker = cfg.batch_size // world

    def batches(self, epoch: int):
        mine = rank_share(self.rows, epoch, self.cfg.seed, self.rank, self.world)
        size = self.per_worker
        steps = len(mine) // size
        shares = (self.batch_rows(mine[b * size : (b + 1) * size]) for b in range(steps))
        return ((rows, rows) for rows in shares), steps

    def batch_rows(self, rows: np.ndarray) -> np.ndarray:
        return rows

    def begin_epoch(self, epoch: int) -> None:
        self.prepared.train()

    def timing(self, trained: EpochTraining) -> dict:
        """``last_lr``, ``seconds`` and ``images_per_s`` (over all workers) of the epoch."""
        seconds = time.perf_counter() - trained.began
        rate = images_per_s(trained.trained_rows() * self.world, seconds)
        return {"last_lr": trained.last_lr, "seconds": seconds, "images_per_s": rate}


class SideInfoTask(FCTTask):
    """SimCLR on unlabelled images: NT-Xent between two ``simclr_views`` of each image."""

    def __init__(self, cfg: SideInfoTrainConfig, dataset, prepared, rank: int, world: int):
        self.dataset = dataset
        rows = image_rows(cfg.data, dataset.labels)
        super().__init__(cfg, "side_info", prepared, rows, rank, world)

    def batches(self, epoch: int):
        seed = (self.cfg.seed * 7919 + epoch) * 1009 + self.rank
        self.views = torch.Generator().manual_seed(seed)
        return super().batches(epoch)

    def loss(self, rows: np.ndarray, poison: bool):
        batch = load_images(self.dataset, rows, "none", None)
        images = self.prepared.prepare_inputs(batch)
        # One forward over both views: DDP allows one forward per backward.
        views = [simclr_views(images, self.views, self.cfg.crop_scale) for _ in range(2)]
        with self.prepared.autocast():
            z = self.prepared.module(torch.cat(views))
        terms = nt_xent_loss(*z.float().chunk(2), temperature=self.cfg.temperature)
        return terms["loss"], {"nt_xent": terms["loss"]}

    def epoch_metrics(self, trained: EpochTraining, guard) -> dict:
        metrics = {"epoch": trained.epoch, "steps": trained.steps}
        metrics["nt_xent"] = trained.sums["nt_xent"] / trained.steps
        return {**metrics, **self.timing(trained)}

    def export(self, directory: str, state: dict, metrics: dict) -> None:
        export_side_info(directory, state, self.cfg.model, epoch=metrics["epoch"])


class TransformationTask(FCTTask):
    """``h`` (and ``g``) by MSE on the stored triples; BN statistics frozen from half the
    epochs on (FCT appendix D); FastFill's loss for ``h`` when it has the uncertainty head."""

    def __init__(self, cfg: TransformationTrainConfig, prepared, triples, rank, world) -> None:
        self.triples = triples
        self.classifier = fixed_classifier(cfg, prepared.device)
        rows = np.arange(len(triples))
        super().__init__(cfg, "transformation", prepared, rows, rank, world)

    def batch_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.sort(rows)  # sequential reads of the memory-mapped triples

    def begin_epoch(self, epoch: int) -> None:
        super().begin_epoch(epoch)
        if epoch >= self.cfg.epochs // 2:  # after train(), which would update the statistics
            freeze_batchnorm_statistics(self.prepared.module)

    def tensor(self, array: np.ndarray | None, rows: np.ndarray) -> torch.Tensor | None:
        if array is None:
            return None
        return torch.from_numpy(np.asarray(array[rows])).to(self.prepared.device)

    def loss(self, rows: np.ndarray, poison: bool):
        old, side = self.tensor(self.triples.old, rows), self.tensor(self.triples.side, rows)
        with self.prepared.autocast():
            h_out, g_out, sigma = self.prepared.module(old, side)
        target = self.tensor(self.triples.new, rows)
        if sigma is None:
            terms = {"h_mse": transformation_loss(h_out.float(), target)["mse"]}
            loss = terms["h_mse"]
        else:
            labels = self.tensor(self.triples.labels, rows)
            weight = self.cfg.discriminative_weight
            loss, terms = uncertain_h_terms(
                h_out.float(),
                sigma.float(),
                target,
                self.classifier,
                labels,
                weight,
                self.cfg.uncertainty_error,
            )
        if g_out is not None:
            target = self.tensor(self.triples.side_new, rows)
            terms["g_mse"] = transformation_loss(g_out.float(), target)["mse"]
            loss = loss + terms["g_mse"]
        return loss, terms

    def epoch_metrics(self, trained: EpochTraining, guard) -> dict:
        metrics = {"epoch": trained.epoch, "steps": trained.steps}
        metrics["bn_frozen"] = trained.epoch >= self.cfg.epochs // 2
        metrics.update({k: v / trained.steps for k, v in trained.sums.items()})
        return {**metrics, **self.timing(trained)}

    def export(self, directory: str, state: dict, metrics: dict) -> None:
        cfg, epoch = self.cfg, metrics["epoch"]
        h = {k[2:]: v for k, v in state.items() if k.startswith("h.")}
        export_transformation(directory, "h", h, dataclasses.asdict(cfg.h), kind="fct", epoch=epoch)
        if cfg.g is not None:
            g = {k[2:]: v for k, v in state.items() if k.startswith("g.")}
            export_transformation(directory, "g", g, g_dims(cfg), kind="fct", epoch=epoch)


def side_info_loop_per_worker(config: dict) -> None:
    cfg: SideInfoTrainConfig = config["cfg"]
    set_log_level()  # RAYCOMPAT_VERBOSE=1 (a job's --verbose): our DEBUG lines too
    dataset = create_dataset(cfg.data.name, **cfg.data.options)  # before seeding the model
    torch.manual_seed(cfg.seed)
    model = create_side_info("simclr", **dataclasses.asdict(cfg.model))
    prepared, rank, world = setup_worker(model, cfg, cfg.scaling.channels_last)
    task = SideInfoTask(cfg, dataset, prepared, rank, world)
    train_worker(task, prepared, cfg, rank, config["marker"])


def transformation_loop_per_worker(config: dict) -> None:
    cfg: TransformationTrainConfig = config["cfg"]
    set_log_level()  # RAYCOMPAT_VERBOSE=1 (a job's --verbose): our DEBUG lines too
    triples = Triples.load(config["triples"])
    torch.manual_seed(cfg.seed)
    prepared, rank, world = setup_worker(build_transformations(cfg), cfg, channels_last=False)
    task = TransformationTask(cfg, prepared, triples, rank, world)
    train_worker(task, prepared, cfg, rank, config["marker"])


# ---- drivers -------------------------------------------------------------------------------


def fit_run(cfg, kind: str, loop, loop_config: dict):
    """Run ``loop`` as the run named ``kind`` under ``<storage_path>/<run.name>/`` (its config
    written there): in one task where the run allows (:mod:`raycompat.cluster.train.task_run`),
    else on Ray Train. Its result: a ``ray.train.Result`` or a ``TaskResult``."""
    fs, base = storage.run_filesystem(cfg.run)
    run_path = f"{base}/{cfg.run.name}"
    fs.create_dir(run_path, recursive=True)
    with fs.open_output_stream(f"{run_path}/{kind}_config.yaml") as out:
        out.write(dump_config(cfg).encode())  # credentials redacted
    config = {"cfg": cfg, "marker": (fs, f"{run_path}/_injected_failure_{kind}"), **loop_config}
    if task_run.runs_in_task(cfg.scaling):
        keep = task_run.Keep(cfg.run.checkpoints_to_keep)
        return task_run.fit_in_task(loop, config, cfg, fs, run_path, kind, keep)
    with report_polling(cfg.run):
        return interrupt.fit(start_run(cfg, kind, loop, config, fs, run_path))


def start_run(cfg, kind: str, loop, config: dict, fs, run_path: str) -> TorchTrainer:
    """A ``TorchTrainer`` named ``kind`` under ``run_path``."""
    return TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=scaling_config(cfg.scaling),
        run_config=RunConfig(
            name=kind,
            storage_path=run_path,
            storage_filesystem=fs,
            failure_config=FailureConfig(max_failures=cfg.run.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.run.checkpoints_to_keep),
            callbacks=[MetricsLog(fs, f"{run_path}/{METRICS_FILE}", kind)],
            logging_config=train_logging_config(),  # Ray Train's INFO lines: --verbose only
        ),
    )


def train_side_info(cfg: SideInfoTrainConfig) -> ray.train.Result:
    """Train the SimCLR side-information model; ``result.checkpoint`` holds ``side_info.*``
    (load with :func:`load_side_info` on ``checkpoint.as_directory()``)."""
    check_side_info_config(cfg)
    return fit_run(cfg, "side_info", side_info_loop_per_worker, {})


def train_transformation(cfg: TransformationTrainConfig) -> ray.train.Result:
    """Train ``h`` (and ``g``) on ``cfg.triples``; ``result.checkpoint`` holds ``h.*``
    (and ``g.*``), loaded with :func:`raycompat.transformations.load_transformation`."""
    path = check_transformation_config(cfg)
    return fit_run(cfg, "transformation", transformation_loop_per_worker, {"triples": path})
