"""The training loader: planned batches decoded in worker processes give exactly what a plain
seeded loop gives, and a bad image is one error naming its row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raycompat.data.augment import AUGMENTATIONS
from raycompat.data.base import ArrayDataset, CorruptDataError
from raycompat.data.synthetic import SyntheticIdentities
from raycompat.train.data import rank_share, sampler_batches
from raycompat.train.loader import BatchLoader, BatchSpec, loader_workers

CPU = torch.device("cpu")


def dataset():
    return SyntheticIdentities(6, 8, image_size=12, seed=3)


def uint8_dataset():
    """A reader that decodes to uint8: its batches are handed over as uint8, widened after."""
    rng = np.random.default_rng(0)
    return ArrayDataset(rng.integers(0, 256, (48, 12, 12, 3), dtype=np.uint8), np.arange(48) % 6)


def naive_batches(data, targets, new, replay, batch_size, epoch, seed, rank, world, augment):
    """The loop the loader replaces: one generator draws the replay picks, then each image's
    augmentation, image by image."""
    transform = AUGMENTATIONS.get(augment)
    gen = torch.Generator().manual_seed((seed * 7919 + epoch) * 1009 + rank)
    mine = rank_share(new, epoch, seed, rank, world)
    half = batch_size // 2 if len(replay) else 0
    replay_mine = rank_share(replay, epoch, seed + 1, rank, world) if half else replay
    for start in range(0, len(mine), batch_size - half):
        rows = mine[start : start + batch_size - half]
        if half:
            pick = torch.randint(0, len(replay_mine), (half,), generator=gen).numpy()
            rows = np.concatenate([replay_mine[pick], rows])
        images = torch.stack([transform(data[int(r)][0], gen) for r in rows])
        yield images, targets[rows], rows


@pytest.mark.parametrize("make", [dataset, uint8_dataset])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("augment", ["none", "crop_flip"])
def test_loader_batches_equal_a_plain_seeded_loop(workers, augment, make):
    data = make()
    targets = torch.from_numpy(data.labels)
    new, replay = np.arange(10, 40), np.arange(0, 10)
    loader = BatchLoader(data, augment, workers, CPU)
    for epoch in (0, 1):  # persistent workers serve a second epoch's plan
        got = list(sampler_batches(data, targets, new, replay, 8, epoch, 5, 1, 2, augment, loader))
        want = list(naive_batches(data, targets, new, replay, 8, epoch, 5, 1, 2, augment))
        assert len(got) == len(want) > 1
        for (batch, rows), (images, batch_targets, want_rows) in zip(got, want, strict=True):
            assert np.array_equal(rows, want_rows)
            assert batch.images.dtype == torch.float32 and torch.equal(batch.images, images)
            assert torch.equal(batch.targets, batch_targets)
            assert batch.replay.tolist() == [True] * 4 + [False] * (len(rows) - 4)


class OneBadRow(SyntheticIdentities):
    def load_batch(self, indices):
        if 7 in indices:
            raise CorruptDataError("faces/0007.jpg: cannot identify image file")
        return super().load_batch(indices)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_image_in_a_worker_is_one_error_naming_the_row_and_file(workers):
    loader = BatchLoader(OneBadRow(2, 8, image_size=8), "flip", workers, CPU)
    specs = [BatchSpec(np.arange(0, 4)), BatchSpec(np.arange(4, 8)), BatchSpec(np.arange(8, 12))]
    with pytest.raises(CorruptDataError) as caught:
        list(loader.images(specs))
    assert str(caught.value) == "row 7: faces/0007.jpg: cannot identify image file"


def test_loader_workers_default_to_all_cpus_but_one():
    assert loader_workers(None, 16) == 15
    assert loader_workers(None, 1) == 0
    assert loader_workers(None, 0.5) == 0
    assert loader_workers(3, 16) == 3
    assert loader_workers(0, 16) == 0


def test_a_uint8_reader_hands_over_uint8_augmented_in_the_worker():
    """A quarter of float32's bytes cross from the loader process; the loop widens them."""
    from raycompat.train.loader import _DecodeBatches

    augment = AUGMENTATIONS.get("crop_flip")
    rows = np.arange(5)
    params = augment.draw_batch(len(rows), torch.Generator().manual_seed(0))
    images, left = _DecodeBatches(uint8_dataset(), augment, augment_here=True)[
        BatchSpec(rows, params)
    ]
    assert images.dtype == torch.uint8 and left is None
    want = augment.apply(uint8_dataset().batch(rows), params)
    assert torch.equal(images.float().div_(255.0), want)
