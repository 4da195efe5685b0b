"""Decode planned batches in worker processes and hand them to the training loop, on the device.

The training process plans every batch of an epoch (:class:`BatchSpec`: its rows and each
image's augmentation parameters, drawn in exactly the order of a seeded loop), so what a seed
trains on never depends on which process decodes what. A :class:`BatchLoader` then decodes the
planned batches in a torch ``DataLoader``'s persistent worker processes (``workers`` of them,
``prefetch`` batches ahead each), into pinned memory when the device is a GPU, copies them
asynchronously and applies the augmentation there; on CPU the workers apply it. With
``workers=0`` it decodes in the training process, one batch at a time. A reader that decodes
to uint8 (``ImageDataset.batch_uint8``: image folders, CASIA folders and RecordIO, in-memory
arrays) hands its batches over as uint8, a quarter of float32's bytes through shared memory and
over PCIe, and they are widened to float in ``[0, 1]`` in the training process (on the GPU
after the copy): the same values, since the augmentations are copies of pixels.

A batch whose data cannot be read (the reader's ``DataError`` or ``OSError``) fails with one
line naming the row and the reader's message (which names the file), raised in the training
process as a :class:`CorruptDataError`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch.utils.data import DataLoader, Dataset, Sampler

from raycompat.data.augment import AUGMENTATIONS, Augmentation
from raycompat.data.base import CorruptDataError, as_float_images
from raycompat.errors import DataError

log = logging.getLogger(__name__)

PREFETCH_BATCHES = 2  # per loader worker


def loader_workers(configured: int | None, cpus_per_worker: float) -> int:
    """``data.num_loader_workers`` as set, or (None) all but one of the worker's CPUs."""
    if configured is not None:
        return configured
    return max(0, int(cpus_per_worker) - 1)


@dataclass(frozen=True)
class BatchSpec:
    """One planned batch: dataset ``rows`` and their augmentation ``params`` (``(B, k)``; None:
    not augmented)."""

    rows: np.ndarray
    params: torch.Tensor | None = None


def plan_augmentation(augment: Augmentation, rows: np.ndarray, generator) -> torch.Tensor | None:
    """Each row's augmentation parameters, drawn from ``generator`` in row order (None when the
    augmentation draws nothing)."""
    return augment.draw_batch(len(rows), generator) if augment.params else None


@dataclass(frozen=True)
class _Failure:
    """A batch that could not be decoded, returned by a worker (its traceback stays there)."""

    message: str


def _passthrough(item):
    return item


def _one_thread(worker_id: int) -> None:
    """A loader process computes on one thread: torch already does (DataLoader sets it), NumPy's
    BLAS would start one thread per CPU the parent may use (``OMP_NUM_THREADS`` in a Ray
    worker) in every one of the loader processes."""
    threadpool_limits(1)


class _DecodeBatches(Dataset):
    """The dataset a ``DataLoader`` worker holds: a :class:`BatchSpec` -> its images."""

    def __init__(self, dataset, augment: Augmentation, augment_here: bool) -> None:
        self.dataset, self.augment, self.augment_here = dataset, augment, augment_here

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, spec: BatchSpec):
        try:  # uint8 where the reader decodes to it: a quarter of the bytes to hand over
            images = self.dataset.batch_to_hand_over(spec.rows)
        except (DataError, OSError) as error:  # bad data: named, raised in the training process
            return _Failure(_name_bad_row(self.dataset, spec.rows, error))
        if spec.params is not None and self.augment_here:
            return self.augment.apply(images, spec.params), None
        return images, spec.params


def _name_bad_row(dataset, rows: np.ndarray, error: Exception) -> str:
    """``row <r>: <message>``: the first row that fails alone (the whole batch's error if none
    does)."""
    for row in rows:
        try:
            dataset.batch([int(row)])
        except (DataError, OSError) as alone:
            return f"row {int(row)}: {alone}"
    return f"rows {int(rows[0])}..{int(rows[-1])}: {error}"


class _Plan(Sampler):
    """The specs of the current pass; the loader swaps them in before each pass."""

    def __init__(self) -> None:
        self.specs: list[BatchSpec] = []

    def __iter__(self) -> Iterator[BatchSpec]:
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)


class BatchLoader:
    """Decodes :class:`BatchSpec` lists in parallel and yields each batch's images, on
    ``device`` when it is a GPU (copied from pinned memory without blocking), in order.

    Args:
        dataset: an :class:`~raycompat.data.base.ImageDataset` (its ``batch(rows)``).
        augment: an :data:`AUGMENTATIONS` name (what the specs' params mean).
        workers: decode processes (0: in this process).
        device: where the loop computes; on CUDA, augmentation runs there.
        start_method: how the decode processes start (``multiprocessing`` start method; None:
            torch's default, ``fork`` on Linux). Ray workers pass ``forkserver``, as Ray Train
            advises: a process forked from a Ray worker inherits its threads' locks.
    """

    def __init__(
        self,
        dataset,
        augment: str,
        workers: int,
        device: torch.device,
        start_method: str | None = None,
    ) -> None:
        self.augment = AUGMENTATIONS.get(augment)
        self.device = device
        self.on_gpu = device.type == "cuda"
        self.plan = _Plan()
        self.loader = DataLoader(
            _DecodeBatches(dataset, self.augment, augment_here=not self.on_gpu),
            batch_size=None,
            sampler=self.plan,
            collate_fn=_passthrough,
            num_workers=workers,
            persistent_workers=workers > 0,
            prefetch_factor=PREFETCH_BATCHES if workers else None,
            pin_memory=self.on_gpu,
            multiprocessing_context=start_method if workers else None,
            worker_init_fn=_one_thread,
        )

    def images(self, specs: Iterable[BatchSpec]) -> Iterator[torch.Tensor]:
        """The images of each spec, in order: augmented, on the device when it is a GPU."""
        self.plan.specs = list(specs)
        for item in self.loader:
            if isinstance(item, _Failure):
                raise CorruptDataError(item.message)
            images, params = item
            if self.on_gpu:
                images = images.to(self.device, non_blocking=True)
                if params is not None:
                    images = self.augment.apply(images, params)
            images = as_float_images(images)  # uint8 widened here (on the GPU: after the copy)
            yield images
