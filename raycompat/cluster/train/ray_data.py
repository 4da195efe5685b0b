"""Ray Data input for training: row ids -> decode + augment in actors -> worker shards.

The driver builds one dataset of ``(row, target)`` per split and hands it to the trainer as
``datasets={"train": ..., "replay": ...}``; Ray Train splits each across the workers
(``streaming_split(equal=True)``: every worker gets a different, equally long share, so DDP ranks
run the same number of steps). Decoding runs in a pool of actors that open the dataset once.

Nothing a worker trains on depends on Ray's timing: each row's augmentation is drawn from
``(seed, row)`` alone (not from which actor decoded it, nor after which rows), and a worker puts
its share of each epoch in row-id order before drawing its seeded batch order
(:func:`id_ordered_batches`), whatever the order in which Ray's blocks arrived. With one worker
(and with the ``sampler`` loader) the same config and seed give the same batches on every run;
with several, which rows go to which worker is still Ray's (README, "What reproduces").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import ray
import ray.train
import torch

from raycompat.config.train import DataSpec
from raycompat.data.augment import AUGMENTATIONS
from raycompat.methods import Batch
from raycompat.train.data import open_dataset

PREFETCH_BATCHES = 4  # decoded blocks a training worker reads ahead of its loop


class DecodeRows:
    """Stateful ``map_batches`` callable: the dataset reader is opened once per actor."""

    def __init__(self, spec: DataSpec, seed: int) -> None:
        self.dataset = open_dataset(spec)
        self.augment = AUGMENTATIONS.get(spec.augment)
        self.seed = seed

    def _generator(self, row: int) -> torch.Generator:
        """The row's own augmentation stream: the same whichever actor and batch decode it."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + row)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch's rows decoded in one call, each augmented with its own draws; uint8 where
        the reader decodes to it (a quarter of the bytes through the object store and in the
        worker's epoch share; the step widens them on its device), else float32."""
        rows = batch["row"]
        images = self.dataset.batch_to_hand_over(rows)
        if self.augment.params:
            draws = [self.augment.draw(self._generator(int(r))) for r in rows]
            images = self.augment.apply(images, torch.tensor(draws, dtype=torch.int64))
        return {"image": images.numpy(), "target": batch["target"], "row": rows}


def decode_pool_size(cluster_cpus: float, num_workers: int, cpus_per_worker: float) -> int:
    """The most decode actors of the ``ray_data`` loader when ``data.decode_actors`` is unset:
    one per CPU of the cluster that the training workers do not hold, at least one (the pool
    starts at one and grows to it)."""
    return max(1, int(cluster_cpus - num_workers * cpus_per_worker))


def rows_dataset(
    spec: DataSpec,
    rows: np.ndarray,
    targets: np.ndarray,
    seed: int,
    actors: int = 1,
    batch_size: int = 64,
) -> ray.data.Dataset:
    """``(row, target)`` -> decoded, augmented ``image`` in a pool of up to ``actors`` decode
    actors."""
    table = pa.table({"row": rows.astype(np.int64), "target": targets[rows].astype(np.int64)})
    return ray.data.from_arrow(table).map_batches(
        DecodeRows,
        fn_constructor_kwargs={"spec": spec, "seed": seed},
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, actors)),
    )


def in_id_order(parts: Iterable[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate a worker's ``{"image", "target", "row"}`` batches and sort them by ``row``:
    the same tensors whatever order (or block sizes) Ray delivered them in."""
    parts = list(parts)
    if not parts:
        return {
            "image": torch.zeros(0),
            "target": torch.zeros(0, dtype=torch.int64),
            "row": torch.zeros(0, dtype=torch.int64),
        }
    joined = {key: torch.cat([p[key] for p in parts]) for key in ("image", "target", "row")}
    order = torch.argsort(joined["row"], stable=True)
    return {key: value[order] for key, value in joined.items()}


def id_ordered_batches(
    parts: Iterable[dict[str, torch.Tensor]], batch_size: int, generator: torch.Generator
) -> Iterator[dict[str, torch.Tensor]]:
    """A worker's epoch share (:func:`in_id_order`) in a seeded order, in full batches of
    ``batch_size`` (the last, shorter one included)."""
    share = in_id_order(parts)
    order = torch.randperm(len(share["row"]), generator=generator)
    for start in range(0, len(order), batch_size):
        pick = order[start : start + batch_size]
        yield {key: value[pick] for key, value in share.items()}


def shard_batches(
    batch_size: int, has_replay: bool, seed: int, epoch: int, rank: int
) -> Iterator[tuple[Batch, np.ndarray]]:
    """This worker's ``(Batch, row ids)`` from its Ray Data shards; half replay when replaying.

    The worker holds its share of one epoch (decoded) to put it in row-id order first."""
    half = batch_size // 2 if has_replay else 0
    replay_images = replay_targets = replay_rows = None
    if half:
        replay_share = in_id_order(
            ray.train.get_dataset_shard("replay").iter_torch_batches(
                batch_size=1024, prefetch_batches=PREFETCH_BATCHES
            )
        )
        replay_images, replay_targets, replay_rows = (
            replay_share[key] for key in ("image", "target", "row")
        )
    gen = torch.Generator().manual_seed((seed * 7919 + epoch) * 1009 + rank)
    shard = ray.train.get_dataset_shard("train").iter_torch_batches(
        batch_size=1024, prefetch_batches=PREFETCH_BATCHES
    )
    order = torch.Generator().manual_seed((seed + epoch) * 7919 + rank)
    for batch in id_ordered_batches(shard, batch_size - half, order):
        images, targets, rows = batch["image"], batch["target"], batch["row"]
        replay = None
        if half and len(replay_rows):
            pick = torch.randint(0, len(replay_rows), (half,), generator=gen)
            images = torch.cat([replay_images[pick], images])
            targets = torch.cat([replay_targets[pick], targets])
            rows = torch.cat([replay_rows[pick], rows])
            replay = torch.arange(len(rows)) < half
        yield Batch(images=images, targets=targets, replay=replay), rows.numpy()
