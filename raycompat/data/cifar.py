"""CIFAR-10 / CIFAR-100 in the original "python version" pickle format.

Layouts (``root`` may be the extracted folder itself or its parent):

- ``cifar-100-python/{train,test}``: dicts with ``b'data'`` uint8 ``(N, 3072)`` (channel-major,
  3 x 32 x 32), ``b'fine_labels'`` and ``b'coarse_labels'``; ``meta`` holds
  ``b'fine_label_names'``.
- ``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``: ``b'data'`` and ``b'labels'``;
  ``batches.meta`` holds ``b'label_names'``.

CoReS trains on CIFAR-100 and tests 1:1 verification on CIFAR-10 (CoReS sec. 7.1).
Pickles are read with an unpickler that only accepts plain containers and numpy arrays, so a
tampered file cannot run code.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from raycompat.data.base import ArrayDataset, CorruptDataError, Transform

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR file")
        return super().find_class(module, name)


def load_pickle(path: Path) -> dict:
    """Read one CIFAR pickle (a dict with bytes keys); errors name the file."""
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR file not found: {path}")
    try:
        with open(path, "rb") as handle:
            content = _ArrayUnpickler(handle, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        raise CorruptDataError(f"cannot read CIFAR pickle {path}: {error}") from error
    if not isinstance(content, dict):
        raise CorruptDataError(f"{path}: expected a dict, got {type(content).__name__}")
    return content


def _find_folder(root: str | Path, folder: str, needed: str) -> Path:
    """``root/folder`` or ``root`` itself, whichever holds the file ``needed``."""
    root = Path(root)
    for candidate in (root / folder, root):
        if (candidate / needed).is_file():
            return candidate
    raise FileNotFoundError(
        f"no CIFAR data under {root}: expected {root / folder / needed} (python-pickle version)"
    )


def read_cifar_files(
    paths: list[Path], label_key: bytes, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate pickle files -> images uint8 ``(N, 32, 32, 3)``, labels int64 ``(N,)``."""
    images, labels = [], []
    for path in paths:
        content = load_pickle(path)
        for key in (b"data", label_key):
            if key not in content:
                raise CorruptDataError(f"{path}: missing key {key!r}; has {sorted(content)}")
        data = np.asarray(content[b"data"], dtype=np.uint8)
        target = np.asarray(content[label_key], dtype=np.int64)
        if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(target):
            raise CorruptDataError(
                f"{path}: data {data.shape} / labels {target.shape} do not match (N, 3072) / (N,)"
            )
        bad = np.flatnonzero((target < 0) | (target >= num_classes))
        if bad.size:
            raise CorruptDataError(
                f"{path}: label {target[bad[0]]} at row {bad[0]} is outside [0, {num_classes})"
            )
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(target)
    return np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels)


def _names(path: Path, key: bytes, count: int) -> list[str] | None:
    if not path.is_file():
        return None
    names = load_pickle(path).get(key)
    if names is None or len(names) != count:
        return None
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


class CIFAR100(ArrayDataset):
    """CIFAR-100, 100 fine classes (``coarse=True``: the 20 super-classes)."""

    def __init__(
        self,
        root: str | Path,
        train: bool = True,
        coarse: bool = False,
        transform: Transform | None = None,
    ) -> None:
        split = "train" if train else "test"
        folder = _find_folder(root, "cifar-100-python", split)
        kind = b"coarse" if coarse else b"fine"
        count = 20 if coarse else 100
        images, labels = read_cifar_files([folder / split], kind + b"_labels", count)
        names = _names(folder / "meta", kind + b"_label_names", count)
        super().__init__(images, labels, count, names, transform)


class CIFAR10(ArrayDataset):
    """CIFAR-10, 10 classes; train = ``data_batch_1..5`` (50000), test = ``test_batch``."""

    def __init__(
        self, root: str | Path, train: bool = True, transform: Transform | None = None
    ) -> None:
        files = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
        folder = _find_folder(root, "cifar-10-batches-py", files[0])
        images, labels = read_cifar_files([folder / f for f in files], b"labels", 10)
        names = _names(folder / "batches.meta", b"label_names", 10)
        super().__init__(images, labels, 10, names, transform)
