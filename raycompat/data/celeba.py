"""CelebA identities: ``identity_CelebA.txt`` (lines ``000001.jpg 2880``) + ``img_align_celeba/``.

The stored identity numbers (1..10177, with gaps once filtered) are remapped to contiguous labels
``0..n-1`` in increasing order; ``identity_ids[label]`` gives back the stored number.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raycompat.data.base import CorruptDataError, Transform
from raycompat.data.image_folder import FileImageDataset


def read_identity_file(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """``identity_CelebA.txt`` -> (file names, stored identity numbers int64 (N,))."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"CelebA identity file not found: {path} (expected lines '000001.jpg 2880')"
        )
    files, identities = [], []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2 or not fields[1].isdigit():
                raise CorruptDataError(
                    f"{path}:{number}: expected '<image> <identity>', got {line.rstrip()!r}"
                )
            files.append(fields[0])
            identities.append(int(fields[1]))
    if not files:
        raise CorruptDataError(f"{path}: no identity lines")
    return files, np.asarray(identities, dtype=np.int64)


class CelebAIdentities(FileImageDataset):
    """CelebA face images labelled by identity (contiguous labels, ``identity_ids`` mapping)."""

    def __init__(
        self,
        root: str | os.PathLike,
        image_size: int | Sequence[int] | None = None,
        mode: str = "RGB",
        transform: Transform | None = None,
        identity_file: str = "identity_CelebA.txt",
        image_dir: str = "img_align_celeba",
    ) -> None:
        root = Path(root)
        files, stored = read_identity_file(root / identity_file)
        images = root / image_dir
        if not images.is_dir():
            raise FileNotFoundError(
                f"CelebA image folder not found: {images} (expected {image_dir}/000001.jpg ...)"
            )
        self.identity_ids, labels = np.unique(stored, return_inverse=True)
        names = [str(i) for i in self.identity_ids.tolist()]
        super().__init__(
            [str(images / f) for f in files],
            labels.astype(np.int64),
            len(names),
            names,
            image_size,
            mode,
            transform,
        )
        self.root = root
