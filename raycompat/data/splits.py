"""Class-incremental task splits, held-out splits, replay buffers and balanced batches.

- CL2R / IAM-CL2R (HOC sec. 5): an initial task of ``initial`` classes, then equal increments;
  experience replay keeps 20 images per seen class; fine-tuning batches are half replay, half
  new-task samples.
- CoReS (sec. 7.1): the training set grows by ``floor(K / T)`` classes at each of ``T`` upgrades;
  every upgrade trains on the union of the classes so far.
- Model selection (CoReS eq. 10-12) uses a held-out split of the training distribution, never the
  test split.

All random choices are vectorised per class (no Python loop over samples) and seeded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from raycompat.data.base import check_indices, check_labels


def _as_classes(classes: int | Sequence[int]) -> list[int]:
    values = list(range(classes)) if isinstance(classes, int) else [int(c) for c in classes]
    if len(set(values)) != len(values):
        raise ValueError("classes contain duplicates")
    return values


def class_incremental_tasks(
    classes: int | Sequence[int], initial: int, increment: int
) -> list[list[int]]:
    """``classes`` (a count or an ordered list) -> ``[first initial, next increment, ...]``.

    Raises ValueError unless ``len(classes) - initial`` is a multiple of ``increment``.
    """
    values = _as_classes(classes)
    if not 0 < initial <= len(values) or increment <= 0:
        raise ValueError(
            f"need 0 < initial <= {len(values)} and increment > 0, got "
            f"initial={initial}, increment={increment}"
        )
    rest = len(values) - initial
    if rest % increment:
        raise ValueError(
            f"{len(values)} classes: the {rest} after the initial {initial} do not "
            f"divide into increments of {increment}"
        )
    return [values[:initial]] + [
        values[s : s + increment] for s in range(initial, len(values), increment)
    ]


def cores_union_tasks(
    classes: int | Sequence[int], num_steps: int, include_remainder: bool = False
) -> list[list[int]]:
    """CoReS growing training sets: step ``t`` (0-based) holds the first ``(t+1) * floor(K/T)``
    classes. The ``K mod T`` leftover classes are unused, as in the paper, unless
    ``include_remainder`` adds them to the last step."""
    values = _as_classes(classes)
    if not 0 < num_steps <= len(values):
        raise ValueError(f"num_steps must be in [1, {len(values)}], got {num_steps}")
    step = len(values) // num_steps
    unions = [values[: (t + 1) * step] for t in range(num_steps)]
    if include_remainder:
        unions[-1] = values
    return unions


def _shuffled_ranks(labels: np.ndarray, rng: np.random.Generator):
    """Rows grouped by class in random order within each class.

    Returns ``(order, rank, count)``: ``order`` (N,) row indices; for position p, ``rank[p]`` is
    its position inside its class and ``count[p]`` the size of that class.
    """
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    grouped = labels[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    sizes = np.diff(np.r_[starts, len(grouped)])
    rank = np.arange(len(grouped)) - np.repeat(starts, sizes)
    return order, rank, np.repeat(sizes, sizes)


def holdout_split(
    labels: Sequence[int] | np.ndarray, fraction: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Per-class split of rows into ``(train, held_out)`` sorted index arrays.

    Each class with ``n`` rows gives ``round(fraction * n)`` rows (at most ``n - 1``) to the
    held-out part, used for model selection on the training distribution.
    """
    labels = check_labels(labels)
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    order, rank, count = _shuffled_ranks(labels, np.random.default_rng(seed))
    held = np.minimum(np.floor(fraction * count + 0.5), count - 1)
    mask = rank < held
    return np.sort(order[~mask]), np.sort(order[mask])


def replay_buffer(
    labels: Sequence[int] | np.ndarray, classes: Sequence[int], per_class: int = 20, seed: int = 0
) -> np.ndarray:
    """Sorted row indices of ``per_class`` random rows of each of ``classes`` (all rows of a
    class that has fewer). CL2R keeps 20 images per class (HOC sec. 5)."""
    labels = check_labels(labels)
    if per_class < 0:
        raise ValueError(f"per_class must be >= 0, got {per_class}")
    wanted = np.asarray(list(classes), dtype=np.int64)
    missing = np.setdiff1d(wanted, labels)
    if missing.size:
        raise ValueError(f"classes {missing[:10].tolist()} have no rows in labels")
    rows = np.flatnonzero(np.isin(labels, wanted))
    order, rank, _ = _shuffled_ranks(labels[rows], np.random.default_rng(seed))
    return np.sort(rows[order[rank < per_class]])


class BalancedBatchSampler(Sampler[list[int]]):
    """Batches of ``batch_size // 2`` replay rows then ``batch_size - batch_size // 2`` new rows.

    One epoch visits every new-task row once (shuffled); replay rows are drawn by cycling
    through reshuffled passes of the buffer. With an empty buffer (first task) batches hold
    only new rows. A shorter last batch keeps the same replay/new proportion. Epoch ``e`` is
    shuffled with ``(seed, e)``; the epoch advances at each iteration or via :meth:`set_epoch`.
    """

    def __init__(
        self,
        new_indices: Sequence[int] | np.ndarray,
        replay_indices: Sequence[int] | np.ndarray,
        batch_size: int,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        bound = np.iinfo(np.int64).max
        self.new = check_indices(new_indices, bound)
        self.replay = check_indices(replay_indices, bound)
        if len(self.new) == 0:
            raise ValueError("new_indices is empty")
        if batch_size < 2:
            raise ValueError(f"batch_size must be >= 2, got {batch_size}")
        self.batch_size, self.seed, self.drop_last, self.epoch = batch_size, seed, drop_last, 0
        self.replay_per_batch = batch_size // 2 if len(self.replay) else 0
        self.new_per_batch = batch_size - self.replay_per_batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        rounding = math.floor if self.drop_last else math.ceil
        return rounding(len(self.new) / self.new_per_batch)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        new = self.new[rng.permutation(len(self.new))]
        batches = len(self)
        new_counts = np.minimum(
            self.new_per_batch, len(new) - self.new_per_batch * np.arange(batches)
        )
        replay_counts = (new_counts * self.replay_per_batch) // self.new_per_batch
        passes = -(-int(replay_counts.sum()) // max(len(self.replay), 1))
        stream = (
            np.concatenate([self.replay[rng.permutation(len(self.replay))] for _ in range(passes)])
            if passes
            else self.replay[:0]
        )
        new_start = replay_start = 0
        for n_new, n_replay in zip(new_counts.tolist(), replay_counts.tolist(), strict=True):
            batch = np.concatenate(
                [stream[replay_start : replay_start + n_replay], new[new_start : new_start + n_new]]
            )
            new_start, replay_start = new_start + n_new, replay_start + n_replay
            yield batch.tolist()
