"""Class-incremental splits, held-out splits, replay buffers and balanced batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from raycompat.data import (
    ArrayDataset,
    BalancedBatchSampler,
    class_incremental_tasks,
    cores_union_tasks,
    holdout_split,
    replay_buffer,
)


def test_class_incremental_tasks_cl2r_cifar100():
    tasks = class_incremental_tasks(100, initial=10, increment=10)
    assert len(tasks) == 10 and tasks[0] == list(range(10)) and tasks[9] == list(range(90, 100))
    assert class_incremental_tasks([5, 3, 9, 1, 7], initial=3, increment=1) == [[5, 3, 9], [1],
                                                                                [7]]
    assert class_incremental_tasks(4, initial=4, increment=2) == [[0, 1, 2, 3]]
    # IAM-CL2R on CIFAR-100 with 31 tasks: 10 initial classes then 30 tasks of 3
    assert [len(t) for t in class_incremental_tasks(100, 10, 3)] == [10] + [3] * 30


def test_class_incremental_tasks_errors():
    with pytest.raises(ValueError, match="the 90 after the initial 10 do not divide into "
                                         "increments of 7"):
        class_incremental_tasks(100, initial=10, increment=7)
    with pytest.raises(ValueError, match="initial"):
        class_incremental_tasks(10, initial=0, increment=2)
    with pytest.raises(ValueError, match="duplicates"):
        class_incremental_tasks([1, 1, 2], initial=1, increment=1)


def test_cores_union_tasks_grow_by_floor_k_over_t():
    unions = cores_union_tasks(100, num_steps=3)
    assert [len(u) for u in unions] == [33, 66, 99]
    assert all(u[: len(v)] == v for u, v in zip(unions[1:], unions[:-1], strict=True))
    assert cores_union_tasks(100, 3, include_remainder=True)[-1] == list(range(100))
    assert cores_union_tasks(10, 5)[1] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="num_steps"):
        cores_union_tasks(4, num_steps=5)


def test_holdout_split_per_class_counts():
    labels = np.array([0] * 10 + [1] * 5 + [2] * 1 + [3] * 3)
    rng = np.random.default_rng(0)
    labels = labels[rng.permutation(len(labels))]
    train, held = holdout_split(labels, fraction=0.2, seed=1)
    assert np.intersect1d(train, held).size == 0
    assert np.array_equal(np.sort(np.concatenate([train, held])), np.arange(len(labels)))
    # round(0.2 * n), at most n - 1: 10 -> 2, 5 -> 1, 1 -> 0, 3 -> 1
    assert np.bincount(labels[held], minlength=4).tolist() == [2, 1, 0, 1]
    # 0.6: 10 -> 6, 5 -> 3, 1 -> 0 (a single row stays in training), 3 -> 2
    assert np.bincount(labels[holdout_split(labels, 0.6)[1]], minlength=4).tolist() == [6, 3, 0, 2]
    again = holdout_split(labels, fraction=0.2, seed=1)
    assert np.array_equal(again[1], held)
    other = [holdout_split(labels, 0.2, seed=s)[1] for s in range(2, 6)]
    assert any(not np.array_equal(o, held) for o in other)
    with pytest.raises(ValueError, match="fraction"):
        holdout_split(labels, fraction=1.0)
    with pytest.raises(ValueError, match="1-D"):
        holdout_split(labels.reshape(1, -1), fraction=0.5)


def test_replay_buffer_takes_per_class_samples_of_requested_classes():
    labels = np.repeat(np.arange(5), [30, 30, 10, 30, 30])
    buffer = replay_buffer(labels, classes=[0, 2, 3], per_class=20, seed=0)
    assert np.bincount(labels[buffer], minlength=5).tolist() == [20, 0, 10, 20, 0]
    assert np.unique(buffer).size == buffer.size
    assert np.array_equal(buffer, replay_buffer(labels, [0, 2, 3], 20, seed=0))
    assert not np.array_equal(buffer, replay_buffer(labels, [0, 2, 3], 20, seed=1))
    with pytest.raises(ValueError, match=r"classes \[7\] have no rows"):
        replay_buffer(labels, classes=[0, 7])


def test_balanced_batches_are_half_replay_half_new():
    new = np.arange(100, 150)  # 50 rows of the current task
    replay = np.arange(0, 12)  # a 12-row buffer
    sampler = BalancedBatchSampler(new, replay, batch_size=8, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 13  # ceil(50 / 4)
    for batch in batches[:-1]:
        assert sum(i < 100 for i in batch) == 4 and sum(i >= 100 for i in batch) == 4
    assert len(batches[-1]) == 4  # 2 new rows left -> 2 replay rows
    seen_new = sorted(i for b in batches for i in b if i >= 100)
    assert seen_new == new.tolist()  # every new row exactly once per epoch
    replayed = [i for b in batches for i in b if i < 100]
    assert len(replayed) == 50 and set(replayed) == set(range(12))
    assert np.bincount(replayed).min() >= 4  # cycled through reshuffled passes, not at random

    next_epoch = list(sampler)
    assert next_epoch != batches
    replay_run = BalancedBatchSampler(new, replay, batch_size=8, seed=0)
    assert list(replay_run) == batches  # same seed, same epoch -> same batches
    replay_run.set_epoch(1)
    assert list(replay_run) == next_epoch


def test_balanced_batches_without_replay_and_drop_last():
    sampler = BalancedBatchSampler(np.arange(10), [], batch_size=4, drop_last=True)
    batches = list(sampler)
    assert len(batches) == 2 and all(len(b) == 4 for b in batches)
    with pytest.raises(ValueError, match="batch_size"):
        BalancedBatchSampler(np.arange(10), [1], batch_size=1)
    with pytest.raises(IndexError, match="index -1"):
        BalancedBatchSampler([0, -1], [1], batch_size=4)


def test_balanced_sampler_drives_a_dataloader():
    images = np.zeros((20, 2, 2), dtype=np.uint8)
    labels = np.repeat(np.arange(4), 5)
    dataset = ArrayDataset(images, labels)
    old = replay_buffer(labels, classes=[0, 1], per_class=2, seed=0)
    new = np.flatnonzero(labels >= 2)
    loader = DataLoader(dataset, batch_sampler=BalancedBatchSampler(new, old, batch_size=4))
    batch_labels = [y for _, y in loader]
    assert all(isinstance(y, torch.Tensor) for y in batch_labels)
    assert all((y[:2] < 2).all() and (y[2:] >= 2).all() for y in batch_labels)
    assert sum(len(y) for y in batch_labels) == 20
