"""Ray Data input for training: row ids -> decode + augment in actors -> worker shards.

The driver builds one dataset of ``(row, target)`` per split and hands it to the trainer as
``datasets={"train": ..., "replay": ...}``; Ray Train splits each across the workers
(``streaming_split(equal=True)``: every worker gets a different, equally long share, so DDP ranks
run the same number of steps). Decoding runs in a pool of actors that open the dataset once.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import ray
import ray.train
import torch

from raycompat.config.train import DataSpec
from raycompat.data.augment import AUGMENTATIONS
from raycompat.methods import Batch
from raycompat.train.data import open_dataset


class DecodeRows:
    """Stateful ``map_batches`` callable: the dataset reader is opened once per actor."""

    def __init__(self, spec: DataSpec, seed: int) -> None:
        self.dataset = open_dataset(spec)
        self.augment = AUGMENTATIONS.get(spec.augment)
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        images = [self.augment(self.dataset[int(r)][0], self.generator) for r in batch["row"]]
        return {
            "image": torch.stack(images).numpy(),
            "target": batch["target"],
            "row": batch["row"],
        }


def rows_dataset(
    spec: DataSpec,
    rows: np.ndarray,
    targets: np.ndarray,
    seed: int,
    actors: int = 1,
    batch_size: int = 64,
) -> ray.data.Dataset:
    table = pa.table({"row": rows.astype(np.int64), "target": targets[rows].astype(np.int64)})
    return ray.data.from_arrow(table).map_batches(
        DecodeRows,
        fn_constructor_kwargs={"spec": spec, "seed": seed},
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, actors)),
    )


def shard_batches(
    batch_size: int, has_replay: bool, seed: int, epoch: int, rank: int
) -> Iterator[tuple[Batch, np.ndarray]]:
    """This worker's ``(Batch, row ids)`` from its Ray Data shards; half replay when replaying."""
    half = batch_size // 2 if has_replay else 0
    replay_images = replay_targets = replay_rows = None
    if half:
        parts = list(ray.train.get_dataset_shard("replay").iter_torch_batches(batch_size=1024))
        replay_images = torch.cat([p["image"] for p in parts])
        replay_targets = torch.cat([p["target"] for p in parts])
        replay_rows = torch.cat([p["row"] for p in parts])
    gen = torch.Generator().manual_seed((seed * 7919 + epoch) * 1009 + rank)
    shard = ray.train.get_dataset_shard("train")
    for batch in shard.iter_torch_batches(
        batch_size=batch_size - half,
        local_shuffle_buffer_size=4 * batch_size,
        local_shuffle_seed=seed + epoch,
    ):
        images, targets, rows = batch["image"], batch["target"], batch["row"]
        replay = None
        if half and len(replay_rows):
            pick = torch.randint(0, len(replay_rows), (half,), generator=gen)
            images = torch.cat([replay_images[pick], images])
            targets = torch.cat([replay_targets[pick], targets])
            rows = torch.cat([replay_rows[pick], rows])
            replay = torch.arange(len(rows)) < half
        yield Batch(images=images, targets=targets, replay=replay), rows.numpy()
