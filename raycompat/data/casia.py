"""CASIA-WebFace (the CoReS face setting): one folder per identity, or insightface RecordIO.

insightface packs face datasets (``faces_webface_112x112/train.rec`` + ``train.idx``) as:
record 0 = a header record with no image whose label is ``(first_identity_key, end_key)``;
image records at keys ``1 .. first_identity_key - 1``, each labelled with its identity; then one
record per identity (keys ``first_identity_key .. end_key - 1``) whose label is the
``(start, end)`` key range of its images. Files without the header record are read as a plain
list of image records. Identity labels are remapped to ``0..n-1`` (``identity_ids`` keeps the
stored value of each class).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from raycompat.data.base import CorruptDataError, ImageDataset, Transform
from raycompat.data.image_folder import EncodedImages, ImageFolder, as_hw, read_image
from raycompat.data.recordio import (
    IRHeader,
    RecordIOReader,
    pack_record,
    unpack_record,
    write_recordio,
)

logger = logging.getLogger(__name__)


def _image_keys(reader: RecordIOReader) -> np.ndarray:
    """Keys of the image records, skipping insightface's header and identity records."""
    if 0 in reader:
        header, data = unpack_record(reader.read(0), f"{reader.path} key 0")
        if header.flag >= 2 and not data:
            first_identity = int(header.label[0])
            return np.arange(1, first_identity, dtype=np.int64)
    return reader.keys


def _label_of(header: IRHeader, name: str) -> int:
    value = float(header.label[0] if header.flag > 0 else header.label)
    if value != int(value) or value < 0:
        raise CorruptDataError(f"{name}: label {value} is not a non-negative integer")
    return int(value)


class InsightfaceRecordDataset(EncodedImages):
    """Images of an insightface ``.rec``/``.idx`` pair; labels read from the record headers."""

    def __init__(
        self,
        path_rec: str | os.PathLike,
        path_idx: str | os.PathLike | None = None,
        image_size: int | Sequence[int] | None = None,
        mode: str = "RGB",
        transform: Transform | None = None,
    ) -> None:
        if path_idx is None and Path(path_rec).with_suffix(".idx").is_file():
            path_idx = Path(path_rec).with_suffix(".idx")
        self.reader = RecordIOReader(path_rec, path_idx)
        self.keys = _image_keys(self.reader)
        stored = np.fromiter(
            (
                _label_of(self.reader.read_header(k), f"{self.reader.path} key {k}")
                for k in self.keys.tolist()
            ),
            dtype=np.int64,
            count=len(self.keys),
        )
        self.identity_ids, labels = np.unique(stored, return_inverse=True)
        names = [str(i) for i in self.identity_ids.tolist()]
        super().__init__(labels.astype(np.int64), len(names), names, transform)
        self.image_size = as_hw(image_size)
        self.mode = mode
        logger.debug("%s: %d images, %d identities", self.reader.path, len(self), self.num_classes)

    def load_image(self, index: int) -> torch.Tensor:
        key = int(self.keys[index])
        name = f"{self.reader.path} key {key}"
        _, data = unpack_record(self.reader.read(key), name)
        return read_image(data, mode=self.mode, size=self.image_size, name=name)

    def encoded(self, indices: np.ndarray) -> tuple[list[bytes], list[str]]:
        names = [f"{self.reader.path} key {key}" for key in self.keys[indices].tolist()]
        encoded = [
            unpack_record(self.reader.read(int(key)), name)[1]
            for key, name in zip(self.keys[indices].tolist(), names, strict=True)
        ]
        return encoded, names


def write_insightface_recordio(
    path_rec: str | os.PathLike,
    path_idx: str | os.PathLike,
    samples: Iterable[tuple[int, bytes | str | os.PathLike]],
) -> int:
    """Pack ``(identity, encoded image bytes or image path)`` samples in insightface's layout
    (header record, images grouped by identity, identity records). Returns the image count."""
    ordered = sorted(samples, key=lambda sample: int(sample[0]))
    identities = sorted({int(label) for label, _ in ordered})
    first_identity = len(ordered) + 1
    starts = np.searchsorted([int(label) for label, _ in ordered], identities) + 1
    ends = np.append(starts[1:], first_identity)

    def records():
        yield (
            0,
            pack_record(
                IRHeader(0, np.array([first_identity, first_identity + len(identities)]), 0, 0), b""
            ),
        )
        for key, (label, image) in enumerate(ordered, 1):
            data = image if isinstance(image, bytes) else Path(image).read_bytes()
            yield key, pack_record(IRHeader(0, float(label), key, 0), data)
        for offset, (start, end) in enumerate(zip(starts, ends, strict=True)):
            yield (
                first_identity + offset,
                pack_record(IRHeader(0, np.array([start, end]), 0, 0), b""),
            )

    write_recordio(path_rec, path_idx, records())
    return len(ordered)


def casia_webface(
    root: str | os.PathLike,
    image_size: int | Sequence[int] | None = 112,
    mode: str = "RGB",
    transform: Transform | None = None,
) -> ImageDataset:
    """CASIA-WebFace from ``root``: a ``.rec`` file, a folder holding ``train.rec`` (+ ``.idx``),
    or a folder with one sub-folder per identity. Images are resized to ``image_size``."""
    root = Path(root)
    if root.suffix == ".rec" or (root / "train.rec").is_file():
        path_rec = root if root.suffix == ".rec" else root / "train.rec"
        return InsightfaceRecordDataset(path_rec, None, image_size, mode, transform)
    if not root.is_dir():
        raise FileNotFoundError(
            f"CASIA-WebFace not found at {root}: expected train.rec/train.idx "
            f"or one sub-folder per identity"
        )
    return ImageFolder(root, image_size, mode, transform=transform)
