"""Which rows each step trains and evaluates on, and how a worker iterates its share of them.

:func:`step_rows` is a pure function of the labels and the config, so the driver and every
worker compute the same splits without exchanging index arrays. Two loaders feed the loop:

- ``sampler``: each worker reads the core dataset itself; a seeded per-epoch permutation is
  split by rank (padded so every rank runs the same number of steps, as DistributedSampler does).
  Fully deterministic: a resumed run sees exactly the batches an uninterrupted one would.
- ``ray_data``: the driver builds Ray Data datasets of row ids, decoded and augmented by actors
  (:mod:`raycompat.cluster.train.ray_data`); workers read ``get_dataset_shard(...)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from raycompat.config.checks import check_eval_split
from raycompat.config.train import DataSpec, TrainConfig
from raycompat.data import LFWPairs, create_dataset
from raycompat.data.augment import AUGMENTATIONS
from raycompat.data.splits import holdout_split, replay_buffer
from raycompat.engine import embed
from raycompat.evaluation import EvalSet, verification_eval_set
from raycompat.methods import Batch
from raycompat.train.loader import BatchLoader, BatchSpec, plan_augmentation
from raycompat.train.scenarios import StepPlan


@dataclass
class Splits:
    """Row indices into the training dataset (``test`` may index ``eval.dataset`` instead)."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def open_dataset(spec: DataSpec):
    return create_dataset(spec.name, **spec.options)


def describe_split(cfg: TrainConfig) -> str:
    """One sentence for reports: which images every table is measured on."""
    spec = cfg.eval
    if spec.dataset is not None:
        return f"a separate test dataset ({spec.dataset.name}), none of its images trained on"
    if spec.split == "open_set":
        return (
            f"open-set: queries and gallery are every image of classes {spec.test_classes}, "
            "which no model in the history trained on"
        )
    return (
        f"closed-set: {spec.test_fraction:.0%} of every class's images held out; the test "
        "classes are classes the models trained on"
    )


def make_splits(cfg: TrainConfig, labels: np.ndarray) -> Splits:
    """Seeded splits: test (unless a separate eval dataset), val, and train.

    closed_set: ``eval.test_fraction`` of every class is the test split. open_set: every
    image of ``eval.test_classes`` is, and val and train come from the other classes.
    """
    rows = np.arange(len(labels))
    check_eval_split(cfg, labels)
    if cfg.eval.split == "open_set":
        unseen = np.isin(labels, cfg.eval.test_classes)
        keep, test = rows[~unseen], rows[unseen]
    elif cfg.eval.dataset is None:
        keep, test = holdout_split(labels, cfg.eval.test_fraction, seed=cfg.seed)
    else:
        keep, test = rows, np.zeros(0, dtype=np.int64)
    if cfg.eval.val_fraction > 0:
        train_pos, val_pos = holdout_split(labels[keep], cfg.eval.val_fraction, seed=cfg.seed + 1)
        train, val = keep[train_pos], keep[val_pos]
    else:
        train, val = keep, np.zeros(0, dtype=np.int64)
    return Splits(train=train, val=val, test=test)


def step_rows(plan: StepPlan, labels: np.ndarray, splits: Splits, cfg: TrainConfig):
    """``(new rows, replay rows)`` of the training split for one step."""
    train = splits.train
    new = train[np.isin(labels[train], plan.classes)]
    if not len(new):
        raise ValueError(f"{plan.name}: no training rows for classes {plan.classes[:10]}...")
    replay = np.zeros(0, dtype=np.int64)
    if plan.replay_classes and cfg.scenario.replay_per_class:
        positions = replay_buffer(
            labels[train], plan.replay_classes, cfg.scenario.replay_per_class, seed=cfg.seed
        )
        replay = train[positions]
    return new, replay


def eval_rows(plan: StepPlan, labels: np.ndarray, rows: np.ndarray, restrict: bool) -> np.ndarray:
    """Validation rows restricted to the classes the step has seen (model selection)."""
    return rows[np.isin(labels[rows], plan.classes + plan.replay_classes)] if restrict else rows


def targets_for(plan: StepPlan, labels: np.ndarray) -> torch.Tensor:
    """Head index of every row's label (-1 for classes the step never trains on)."""
    lookup = np.full(int(np.max(labels, initial=0)) + 1, -1, dtype=np.int64)
    for c, o in plan.label_map.items():
        if c < len(lookup):
            lookup[c] = o
    return torch.from_numpy(lookup[np.asarray(labels, dtype=np.int64)])


def test_eval_set(cfg: TrainConfig, test_labels: np.ndarray, pairs=None, folds=None) -> EvalSet:
    if cfg.eval.protocol == "verification" and pairs is None:
        return verification_eval_set(test_labels, cfg.eval.pairs, seed=cfg.seed)
    return EvalSet(labels=test_labels, pairs=pairs, folds=folds)


def test_source(cfg: TrainConfig, dataset, labels: np.ndarray, splits: Splits):
    """``(dataset, rows, EvalSet)`` of the test images: a held-out split of the training data,
    or ``eval.dataset`` (an LFW-style pairs dataset brings its own pairs and folds)."""
    if cfg.eval.dataset is None:
        return dataset, splits.test, test_eval_set(cfg, labels[splits.test])
    source = open_dataset(cfg.eval.dataset)
    if isinstance(source, LFWPairs):
        pairs = np.stack([source.left, source.right, source.same.astype(np.int64)], axis=1)
        images = source.images
        return images, np.arange(len(images)), EvalSet(images.labels, pairs, source.fold)
    return source, np.arange(len(source)), test_eval_set(cfg, source.labels)


def rank_share(
    rows: np.ndarray, epoch: int, seed: int, rank: int, world: int, shuffle: bool = True
) -> np.ndarray:
    """This rank's rows for one epoch: a seeded permutation, padded to a multiple of ``world``
    by repeating its head, then every ``world``-th row from ``rank``."""
    order = rows
    if shuffle:
        gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
        order = rows[torch.randperm(len(rows), generator=gen).numpy()]
    pad = (-len(order)) % world
    order = np.concatenate([order, order[:pad]])
    return order[rank::world]


def load_images(dataset, rows: np.ndarray, augment: str, generator: torch.Generator | None):
    """``rows``' images, decoded a batch at a time, each augmented with parameters drawn from
    ``generator`` in row order (the in-process path of :class:`BatchLoader`)."""
    transform = AUGMENTATIONS.get(augment)
    images = dataset.batch(rows)
    params = plan_augmentation(transform, rows, generator)
    return images if params is None else transform.apply(images, params)


def epoch_plan(
    new: np.ndarray,
    replay: np.ndarray,
    batch_size: int,
    epoch: int,
    seed: int,
    rank: int,
    world: int,
    augment: str,
) -> list[tuple[BatchSpec, np.ndarray]]:
    """This rank's batches of one epoch, ``(spec, replay flags)``: a seeded permutation of its
    share (:func:`rank_share`); when replaying, half of every batch is drawn from the replay
    rows first. One generator draws the replay picks and then each image's augmentation, batch
    after batch, so the plan is a function of the seed alone."""
    transform = AUGMENTATIONS.get(augment)
    gen = torch.Generator().manual_seed((seed * 7919 + epoch) * 1009 + rank)
    mine = rank_share(new, epoch, seed, rank, world)
    half = batch_size // 2 if len(replay) else 0
    replay_mine = rank_share(replay, epoch, seed + 1, rank, world) if half else replay
    step = batch_size - half
    plan = []
    for start in range(0, len(mine), step):
        rows = mine[start : start + step]
        flags = np.zeros(len(rows) + half, dtype=bool)
        if half:
            pick = torch.randint(0, len(replay_mine), (half,), generator=gen).numpy()
            rows = np.concatenate([replay_mine[pick], rows])
            flags[:half] = True
        plan.append((BatchSpec(rows, plan_augmentation(transform, rows, gen)), flags))
    return plan


def sampler_batches(
    dataset,
    targets: torch.Tensor,
    new: np.ndarray,
    replay: np.ndarray,
    batch_size: int,
    epoch: int,
    seed: int,
    rank: int,
    world: int,
    augment: str,
    loader: BatchLoader | None = None,
) -> Iterator[tuple[Batch, np.ndarray]]:
    """This rank's ``(Batch, row ids)`` for one epoch (:func:`epoch_plan`), decoded by
    ``loader`` (default: in this process, on the CPU)."""
    plan = epoch_plan(new, replay, batch_size, epoch, seed, rank, world, augment)
    loader = loader or BatchLoader(dataset, augment, 0, torch.device("cpu"))
    images = loader.images(spec for spec, _ in plan)
    for (spec, flags), batch_images in zip(plan, images, strict=True):
        replay_flags = torch.from_numpy(flags) if len(replay) else None
        yield Batch(images=batch_images, targets=targets[spec.rows], replay=replay_flags), spec.rows


@torch.no_grad()
def extract(
    prepared,
    dataset,
    rows: np.ndarray,
    batch_size: int,
    rank: int,
    world: int,
    loader: BatchLoader | None = None,
):
    """Features of ``rows`` in order; every rank extracts a strided share (collective), its
    images decoded by ``loader`` (default: in this process)."""
    pad = (-len(rows)) % world
    padded = np.concatenate([rows, np.repeat(rows[-1:], pad)]) if len(rows) else rows
    mine = padded[rank::world]
    prepared.eval()
    parts = []

    def features(images: torch.Tensor) -> torch.Tensor:  # through the strategy's wrapper
        return prepared.module(images, output="features")

    loader = loader or BatchLoader(dataset, "none", 0, torch.device("cpu"))
    specs = [BatchSpec(mine[i : i + batch_size]) for i in range(0, len(mine), batch_size)]
    for images in loader.images(specs):
        images = prepared.prepare_inputs(images)
        with prepared.autocast():
            parts.append(embed(features, images, normalize=False))
    prepared.train()
    local = torch.cat(parts).float() if parts else torch.zeros(0, prepared.model.embed_dim)
    if world > 1:
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        local = torch.stack(gathered, dim=1).reshape(-1, local.shape[-1])
    return local[: len(rows)].cpu()
