"""Dataset readers (plain PyTorch/NumPy) and class-incremental splits.

Every builder in :data:`DATASETS` returns an :class:`ImageDataset` (``labels`` known up front,
``dataset[i] -> (float image (C, H, W) in [0, 1], int label)``), except ``lfw`` and ``lfw_bin``,
which return an :class:`LFWPairs` (verification pairs over an ImageDataset of their images).
Builders take keyword arguments only; none downloads anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raycompat.data.base import (
    ArrayDataset,
    CorruptDataError,
    ImageDataset,
    SubsetDataset,
    Transform,
)
from raycompat.data.casia import (
    InsightfaceRecordDataset,
    casia_webface,
    write_insightface_recordio,
)
from raycompat.data.celeba import CelebAIdentities
from raycompat.data.cifar import CIFAR10, CIFAR100
from raycompat.data.image_folder import FileImageDataset, ImageFolder, read_image
from raycompat.data.lfw import LFWPairs, load_lfw, parse_pairs
from raycompat.data.mnist import MNIST5k, load_mnist5k, mnist5k_path
from raycompat.data.recordio import (
    IRHeader,
    RecordIOReader,
    pack_record,
    unpack_record,
    write_recordio,
)
from raycompat.data.splits import (
    BalancedBatchSampler,
    class_incremental_tasks,
    cores_union_tasks,
    holdout_split,
    replay_buffer,
)
from raycompat.data.synthetic import SyntheticIdentities
from raycompat.data.verification_bin import (
    EncodedImageDataset,
    UnsafePickleError,
    load_verification_bin,
    read_verification_bin,
)
from raycompat.registry import Registry

DATASETS: Registry[Any] = Registry("dataset")

Size = int | Sequence[int] | None


@DATASETS.register("mnist5k")
def mnist5k(*, transform: Transform | None = None, per_class: int | None = None) -> ImageDataset:
    """MNIST-5k; ``per_class`` keeps the first N images of each digit (small test runs)."""
    return MNIST5k(transform=transform, per_class=per_class)


@DATASETS.register("cifar100")
def cifar100(
    *,
    root: str | Path,
    train: bool = True,
    coarse: bool = False,
    transform: Transform | None = None,
) -> ImageDataset:
    return CIFAR100(root, train=train, coarse=coarse, transform=transform)


@DATASETS.register("cifar10")
def cifar10(
    *, root: str | Path, train: bool = True, transform: Transform | None = None
) -> ImageDataset:
    return CIFAR10(root, train=train, transform=transform)


@DATASETS.register("image_folder")
def image_folder(
    *,
    root: str | Path,
    image_size: Size = None,
    mode: str = "RGB",
    transform: Transform | None = None,
) -> ImageDataset:
    return ImageFolder(root, image_size=image_size, mode=mode, transform=transform)


@DATASETS.register("casia_webface")
def casia(
    *,
    root: str | Path,
    image_size: Size = 112,
    mode: str = "RGB",
    transform: Transform | None = None,
) -> ImageDataset:
    return casia_webface(root, image_size=image_size, mode=mode, transform=transform)


@DATASETS.register("celeba")
def celeba(
    *,
    root: str | Path,
    image_size: Size = None,
    mode: str = "RGB",
    transform: Transform | None = None,
) -> ImageDataset:
    return CelebAIdentities(root, image_size=image_size, mode=mode, transform=transform)


@DATASETS.register("lfw")
def lfw(
    *,
    root: str | Path,
    pairs_path: str | Path | None = None,
    image_size: Size = None,
    mode: str = "RGB",
    transform: Transform | None = None,
) -> LFWPairs:
    return load_lfw(
        root, pairs_path=pairs_path, image_size=image_size, mode=mode, transform=transform
    )


@DATASETS.register("lfw_bin")
def lfw_bin(
    *,
    path: str | Path,
    image_size: Size = None,
    mode: str = "RGB",
    transform: Transform | None = None,
    num_folds: int = 10,
) -> LFWPairs:
    """An insightface verification ``.bin`` (``lfw.bin``, ``cfp_fp.bin``, ``agedb_30.bin``)."""
    return load_verification_bin(
        path, image_size=image_size, mode=mode, transform=transform, num_folds=num_folds
    )


DATASETS.register("synthetic")(SyntheticIdentities)


def create_dataset(name: str, **kwargs: Any) -> Any:
    """Build a registered dataset by name (see :func:`list_datasets`)."""
    return DATASETS.create(name, **kwargs)


def list_datasets() -> list[str]:
    return DATASETS.names()


__all__ = [
    "CIFAR10",
    "CIFAR100",
    "DATASETS",
    "ArrayDataset",
    "BalancedBatchSampler",
    "CelebAIdentities",
    "CorruptDataError",
    "EncodedImageDataset",
    "FileImageDataset",
    "IRHeader",
    "ImageDataset",
    "ImageFolder",
    "InsightfaceRecordDataset",
    "LFWPairs",
    "MNIST5k",
    "RecordIOReader",
    "SubsetDataset",
    "SyntheticIdentities",
    "UnsafePickleError",
    "casia_webface",
    "class_incremental_tasks",
    "cores_union_tasks",
    "create_dataset",
    "holdout_split",
    "list_datasets",
    "load_lfw",
    "load_mnist5k",
    "load_verification_bin",
    "mnist5k_path",
    "pack_record",
    "parse_pairs",
    "read_image",
    "read_verification_bin",
    "replay_buffer",
    "unpack_record",
    "write_insightface_recordio",
    "write_recordio",
]
