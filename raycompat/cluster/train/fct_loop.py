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
  ICLR 2023; :func:`~raycompat.fct.transformation.uncertain_transformation_loss`), plus its
  discriminative term when ``classifier`` names the new model.

Both are Ray Train V2 ``TorchTrainer`` runs stored under ``<run.storage_path>/<run.name>/``:
everything is checked before a worker starts, each worker trains on a different seeded shard of
the rows (DistributedSampler-style), wrapped by a :mod:`raycompat.parallel` strategy, and every
epoch reports a checkpoint holding the strategy state plus the exported pieces
(``side_info.*`` or ``h.*``/``g.*``, see :mod:`raycompat.fct.export`). Rerunning the same
config resumes from the latest checkpoint; failed workers restart from it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
import ray.train
import ray.train.torch
import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig
from ray.train.torch import TorchTrainer
from torch import nn

from raycompat.cluster.console import set_log_level, train_logging_config
from raycompat.cluster.train.epoch_log import (
    METRICS_FILE,
    EpochClock,
    MetricsLog,
    images_per_s,
    log_epoch,
)
from raycompat.cluster.train.loop import TRAIN_STATE, maybe_fail, scaling_config
from raycompat.config import dump_config
from raycompat.config.fct import SideInfoTrainConfig, TransformationTrainConfig
from raycompat.data import create_dataset
from raycompat.fct.checks import (
    check_side_info_config,
    check_transformation_config,
    image_rows,
)
from raycompat.fct.export import (
    export_side_info,
    export_transformation,
    load_side_info,
    load_transformation,
)
from raycompat.fct.transformation import (
    fct_transformation,
    freeze_batchnorm_statistics,
    side_info_transformation,
    transformation_loss,
    uncertain_transformation_loss,
    warmup_cosine,
)
from raycompat.fct.triples import Triples, compute_triples
from raycompat.io import run_storage as storage
from raycompat.nn.side_info import create_side_info, nt_xent_loss, simclr_views
from raycompat.parallel import Prepared, create_strategy
from raycompat.train.data import load_images, rank_share
from raycompat.train.export import load_exported_model
from raycompat.train.schedule import OPTIMIZERS

log = logging.getLogger(__name__)

__all__ = [
    "TransformationPair",
    "compute_triples",
    "load_side_info",
    "load_transformation",
    "train_side_info",
    "train_transformation",
]


class TransformationPair(nn.Module):
    """``h`` and optionally ``g`` behind one ``forward``, so one strategy wraps both.

    One optimizer steps both on the sum of their MSEs; the two share no parameter, so each gets
    exactly the gradient (and, with Adam's per-parameter state, the update) of its own loss.
    """

    def __init__(self, h: nn.Module, g: nn.Module | None = None) -> None:
        super().__init__()
        self.h, self.g = h, g

    def forward(self, old: torch.Tensor, side: torch.Tensor):
        """``(N, d_old), (N, d_side) -> (h (N, d_new), g (N, d_side_new) or None, sigma (N,)
        or None)``; ``sigma``: h's uncertainty, when it has the head."""
        g = self.g(old, side) if self.g is not None else None
        if self.h.uncertainty_head is None:
            return self.h(old, side), g, None
        h, sigma = self.h.forward_with_uncertainty(old, side)
        return h, g, sigma


def build_transformations(cfg: TransformationTrainConfig) -> TransformationPair:
    h = fct_transformation(
        cfg.h.d_old,
        cfg.h.d_side,
        cfg.h.d_new,
        cfg.h.width,
        cfg.h.normalize_output,
        uncertainty=cfg.h.uncertainty,
    )
    g = None
    if cfg.g is not None:
        g = side_info_transformation(cfg.h.d_old, cfg.h.d_side, cfg.g.d_side_new, cfg.g.width)
    return TransformationPair(h, g)


def fixed_classifier(cfg: TransformationTrainConfig, device: torch.device):
    """The new model's ``forward_head`` for FastFill's discriminative term (held fixed), or
    None when ``cfg.classifier`` is not set."""
    if cfg.classifier is None:
        return None
    model = load_exported_model(cfg.classifier)[0].to(device)
    model.requires_grad_(False)
    return model.forward_head


def uncertain_h_terms(h_out, sigma, target, classifier, labels, weight: float):
    """``(loss, logged terms)`` of FastFill's uncertainty-weighted loss for ``h``: ``h_mse``,
    ``h_sigma`` (mean log-variance), ``h_loss`` and, with a classifier,
    ``h_discriminative``."""
    logits = None if classifier is None else classifier(h_out)
    fit = uncertain_transformation_loss(
        h_out, sigma, target, logits, None if logits is None else labels, weight
    )
    return fit["loss"], {f"h_{name}": value for name, value in fit.items()}


def g_dims(cfg: TransformationTrainConfig) -> dict:
    d_old, d_side = cfg.h.d_old, cfg.h.d_side
    return dict(
        d_old=d_old,
        d_side=d_side,
        d_new=cfg.g.d_side_new,
        width=cfg.g.width,
        normalize_output=False,
    )


# ---- per-worker pieces shared by both loops ---------------------------------------------


def setup_worker(model: nn.Module, cfg, channels_last: bool) -> tuple[Prepared, int, int]:
    """Wrap ``model`` with the configured strategy; returns ``(prepared, rank, world)``."""
    ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))
    spec = cfg.optim
    prepared = create_strategy(cfg.scaling.strategy, **cfg.scaling.strategy_options).setup(
        model,
        lambda params: OPTIMIZERS[spec.name](list(params), spec),
        device,
        precision=cfg.scaling.precision if device.type == "cuda" else "fp32",
        channels_last=channels_last and device.type == "cuda",
    )
    return prepared, ctx.get_world_rank(), ctx.get_world_size()


def resume(prepared: Prepared) -> int:
    """The first epoch to train: 0, or one after the restored checkpoint's."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        epoch = prepared.load(os.path.join(directory, TRAIN_STATE))["epoch"]
    log.info("resumed after epoch %d", epoch)
    return epoch + 1


def lr_at(cfg, epoch: int, step: int, steps: int) -> float:
    return cfg.optim.lr * warmup_cosine(epoch + step / steps, cfg.epochs, cfg.optim.warmup_epochs)


def report(prepared: Prepared, metrics: dict, export: Callable[[str, dict], None], rank: int):
    """COLLECTIVE. Save the strategy state, export the pieces on rank 0, report the checkpoint."""
    directory = tempfile.mkdtemp(prefix=f"raycompat-fct-rank{rank}-")
    prepared.save(os.path.join(directory, TRAIN_STATE), {"epoch": metrics["epoch"]})
    state = prepared.full_state_dict()
    if rank == 0:
        export(directory, state)
    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))
    shutil.rmtree(directory, ignore_errors=True)


def log_epoch_line(cfg, kind: str, metrics: dict, terms: dict, clock: EpochClock, rank: int):
    """Rank 0's console line of the epoch just reported (the rest is in metrics.jsonl)."""
    if rank == 0:
        name = f"{cfg.run.name}/{kind}"
        log_epoch(log, name, metrics["epoch"], cfg.epochs, terms, metrics["images_per_s"], clock)


# ---- per-worker loops ----------------------------------------------------------------------


def side_info_loop_per_worker(config: dict) -> None:
    cfg: SideInfoTrainConfig = config["cfg"]
    set_log_level()  # RAYCOMPAT_VERBOSE=1 (a job's --verbose): our DEBUG lines too
    dataset = create_dataset(cfg.data.name, **cfg.data.options)
    rows = image_rows(cfg.data, dataset.labels)
    torch.manual_seed(cfg.seed)
    model = create_side_info("simclr", **dataclasses.asdict(cfg.model))
    prepared, rank, world = setup_worker(model, cfg, cfg.scaling.channels_last)
    per_worker = cfg.batch_size // world
    first = resume(prepared)
    clock = EpochClock(first, cfg.epochs)
    for epoch in range(first, cfg.epochs):
        began, total = time.perf_counter(), 0.0
        mine = rank_share(rows, epoch, cfg.seed, rank, world)
        steps = len(mine) // per_worker  # drop_last: NT-Xent and BN want full batches
        views = torch.Generator().manual_seed((cfg.seed * 7919 + epoch) * 1009 + rank)
        prepared.train()
        for b in range(steps):
            maybe_fail(cfg, 0, epoch, b, rank, config["marker"])
            prepared.set_lr(lr_at(cfg, epoch, b, steps))
            batch = load_images(dataset, mine[b * per_worker : (b + 1) * per_worker], "none", None)
            images = prepared.prepare_inputs(batch)
            # One forward over both views: DDP allows one forward per backward.
            pair = torch.cat([simclr_views(images, views, cfg.crop_scale) for _ in range(2)])
            with prepared.autocast():
                z = prepared.module(pair)
            terms = nt_xent_loss(*z.float().chunk(2), temperature=cfg.temperature)
            prepared.backward_step(terms["loss"])
            total += float(terms["loss"].detach())
        metrics = {
            "epoch": epoch,
            "steps": steps,
            "nt_xent": total / steps,
            "last_lr": lr_at(cfg, epoch, steps - 1, steps),
            "seconds": time.perf_counter() - began,
        }
        metrics["images_per_s"] = images_per_s(steps * per_worker * world, metrics["seconds"])

        def export(directory: str, state: dict, epoch: int = epoch) -> None:
            export_side_info(directory, state, cfg.model, epoch=epoch)

        report(prepared, metrics, export, rank)
        log_epoch_line(cfg, "side_info", metrics, {"nt_xent": metrics["nt_xent"]}, clock, rank)


def transformation_loop_per_worker(config: dict) -> None:
    cfg: TransformationTrainConfig = config["cfg"]
    set_log_level()  # RAYCOMPAT_VERBOSE=1 (a job's --verbose): our DEBUG lines too
    triples = Triples.load(config["triples"])
    torch.manual_seed(cfg.seed)
    prepared, rank, world = setup_worker(build_transformations(cfg), cfg, channels_last=False)
    device, per_worker = prepared.device, cfg.batch_size // world
    rows = np.arange(len(triples))
    classifier = fixed_classifier(cfg, device)

    def tensor(array: np.ndarray | None, batch: np.ndarray) -> torch.Tensor | None:
        return None if array is None else torch.from_numpy(np.asarray(array[batch])).to(device)

    first = resume(prepared)
    clock = EpochClock(first, cfg.epochs)
    for epoch in range(first, cfg.epochs):
        began, sums = time.perf_counter(), {}
        mine = rank_share(rows, epoch, cfg.seed, rank, world)
        steps = len(mine) // per_worker  # drop_last: BatchNorm needs > 1 sample
        prepared.train()
        frozen = epoch >= cfg.epochs // 2
        if frozen:  # after train(), which would switch BN back to updating its statistics
            freeze_batchnorm_statistics(prepared.module)
        for b in range(steps):
            maybe_fail(cfg, 0, epoch, b, rank, config["marker"])
            prepared.set_lr(lr_at(cfg, epoch, b, steps))
            batch = np.sort(mine[b * per_worker : (b + 1) * per_worker])  # sequential reads
            old, side = tensor(triples.old, batch), tensor(triples.side, batch)
            with prepared.autocast():
                h_out, g_out, sigma = prepared.module(old, side)
            target = tensor(triples.new, batch)
            if sigma is None:
                terms = {"h_mse": transformation_loss(h_out.float(), target)["mse"]}
                loss = terms["h_mse"]
            else:
                labels = tensor(triples.labels, batch)
                loss, terms = uncertain_h_terms(
                    h_out.float(),
                    sigma.float(),
                    target,
                    classifier,
                    labels,
                    cfg.discriminative_weight,
                )
            if g_out is not None:
                target = tensor(triples.side_new, batch)
                terms["g_mse"] = transformation_loss(g_out.float(), target)["mse"]
                loss = loss + terms["g_mse"]
            prepared.backward_step(loss)
            for name, value in terms.items():
                sums[name] = sums.get(name, 0.0) + float(value.detach())
        metrics = {
            "epoch": epoch,
            "steps": steps,
            "bn_frozen": frozen,
            "last_lr": lr_at(cfg, epoch, steps - 1, steps),
            "seconds": time.perf_counter() - began,
            **{k: v / steps for k, v in sums.items()},
        }
        metrics["images_per_s"] = images_per_s(steps * per_worker * world, metrics["seconds"])

        def export(directory: str, state: dict, epoch: int = epoch) -> None:
            h = {k[2:]: v for k, v in state.items() if k.startswith("h.")}
            export_transformation(directory, "h", h, dataclasses.asdict(cfg.h), epoch=epoch)
            if cfg.g is not None:
                g = {k[2:]: v for k, v in state.items() if k.startswith("g.")}
                export_transformation(directory, "g", g, g_dims(cfg), epoch=epoch)

        report(prepared, metrics, export, rank)
        terms = {k: metrics[k] for k in sums}
        log_epoch_line(cfg, "transformation", metrics, terms, clock, rank)


# ---- drivers -------------------------------------------------------------------------------


def start_run(cfg, kind: str, loop, loop_config: dict) -> TorchTrainer:
    """A ``TorchTrainer`` named ``kind`` under ``<storage_path>/<run.name>/`` (config written)."""
    fs, base = storage.run_filesystem(cfg.run)
    run_path = f"{base}/{cfg.run.name}"
    fs.create_dir(run_path, recursive=True)
    with fs.open_output_stream(f"{run_path}/{kind}_config.yaml") as out:
        out.write(dump_config(cfg).encode())  # credentials redacted
    return TorchTrainer(
        loop,
        train_loop_config={
            "cfg": cfg,
            "marker": (fs, f"{run_path}/_injected_failure_{kind}"),
            **loop_config,
        },
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
    return start_run(cfg, "side_info", side_info_loop_per_worker, {}).fit()


def train_transformation(cfg: TransformationTrainConfig) -> ray.train.Result:
    """Train ``h`` (and ``g``) on ``cfg.triples``; ``result.checkpoint`` holds ``h.*``
    (and ``g.*``), loaded with :func:`load_transformation`."""
    path = check_transformation_config(cfg)
    return start_run(cfg, "transformation", transformation_loop_per_worker, {"triples": path}).fit()
