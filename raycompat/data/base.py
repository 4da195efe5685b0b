"""Dataset base classes shared by every reader.

Every dataset is an :class:`ImageDataset`: integer ``labels`` of shape ``(N,)`` known up front
(so that splits, replay buffers and class-incremental tasks never decode an image), and
``dataset[i] -> (image, label)`` with ``image`` a float tensor ``(C, H, W)`` in ``[0, 1]``.
``dataset.batch(rows)`` is ``torch.stack([dataset[r][0] for r in rows])`` computed a batch at a
time: readers override :meth:`ImageDataset.load_batch` to decode many images in one call.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from raycompat.errors import DataError

Transform = Callable[[torch.Tensor], torch.Tensor]


class CorruptDataError(DataError, ValueError):
    """A file exists but its content cannot be read (bad magic, undecodable image, bad line)."""


def uint8_to_tensor(image: np.ndarray) -> torch.Tensor:
    """``(H, W)`` or ``(H, W, C)`` uint8 -> float tensor ``(C, H, W)`` in ``[0, 1]``."""
    array = np.asarray(image, dtype=np.float32)  # a fresh writable copy of uint8 data
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).div_(255.0)


def uint8_batch_to_tensor(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``(B, C, H, W)`` -> float ``(B, C, H, W)`` in ``[0, 1]``; the same arithmetic as
    :func:`uint8_to_tensor` per image."""
    return images.to(torch.float32).div_(255.0)


def as_float_images(images: torch.Tensor) -> torch.Tensor:
    """A handed-over batch (:meth:`ImageDataset.batch_to_hand_over`) as the float images the
    model reads: uint8 widened (:func:`uint8_batch_to_tensor`), floats as they are."""
    return uint8_batch_to_tensor(images) if images.dtype == torch.uint8 else images


def check_labels(labels: Sequence[int] | np.ndarray, num_classes: int | None = None) -> np.ndarray:
    """Validate labels: 1-D, integer, in ``[0, num_classes)``. Returns an int64 copy."""
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be 1-D (N,), got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64)
    if array.size and array.min() < 0:
        raise ValueError(f"labels must be >= 0; row {int(np.argmin(array))} is {array.min()}")
    if num_classes is not None and array.size and array.max() >= num_classes:
        row = int(np.argmax(array))
        raise ValueError(f"label {array[row]} at row {row} is >= num_classes={num_classes}")
    return array


def check_indices(indices: Sequence[int] | np.ndarray, length: int) -> np.ndarray:
    """1-D integer indices into a dataset of ``length`` rows (no negatives) -> int64 array."""
    array = np.asarray(indices)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"indices must be a 1-D integer array, got {array.dtype} {array.shape}")
    array = array.astype(np.int64)
    bad = np.flatnonzero((array < 0) | (array >= length))
    if bad.size:
        raise IndexError(f"index {array[bad[0]]} out of range for a dataset of {length} rows")
    return array


class ImageDataset(Dataset):
    """Base class: subclasses set up ``labels`` and implement :meth:`load_image`.

    Attributes:
        labels: int64 ``(N,)``, values in ``[0, num_classes)``.
        num_classes: size of the label space (may exceed the classes present, e.g. in a subset).
        class_names: ``num_classes`` names, or None.
        transform: optional callable applied to the ``(C, H, W)`` float image tensor.
    """

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray,
        num_classes: int | None = None,
        class_names: Sequence[str] | None = None,
        transform: Transform | None = None,
    ) -> None:
        self.labels = check_labels(labels, num_classes)
        if num_classes is None:
            num_classes = int(self.labels.max()) + 1 if self.labels.size else 0
        self.num_classes = int(num_classes)
        if class_names is not None and len(class_names) != self.num_classes:
            raise ValueError(f"got {len(class_names)} class names for {self.num_classes} classes")
        self.class_names = list(class_names) if class_names is not None else None
        self.transform = transform

    def load_image(self, index: int) -> torch.Tensor:
        """The untransformed image of row ``index`` as a float tensor ``(C, H, W)`` in [0, 1]."""
        raise NotImplementedError

    def load_batch(self, indices: np.ndarray) -> torch.Tensor:
        """Untransformed images of rows ``indices`` (int64 ``(B,)``, in range), float
        ``(B, C, H, W)``: equal to stacking :meth:`load_image`, which is what this default does.
        Readers override it to decode a batch in one call (the extraction pipeline's path)."""
        return torch.stack([self.load_image(int(i)) for i in indices])

    def load_batch_uint8(self, indices: np.ndarray) -> torch.Tensor | None:
        """:meth:`load_batch`'s images as the uint8 ``(B, C, H, W)`` they were decoded from
        (``load_batch`` is exactly ``uint8_batch_to_tensor`` of it), for a reader that decodes
        to uint8; None (this default) for one that does not."""
        return None

    def batch(self, indices: Sequence[int] | np.ndarray) -> torch.Tensor:
        """``torch.stack([self[i][0] for i in indices])``: rows ``indices`` (no negatives), with
        the dataset's ``transform``, as float ``(B, C, H, W)``."""
        rows = check_indices(indices, len(self))
        images = self.load_batch(rows)
        if self.transform is not None:
            images = torch.stack([self.transform(image) for image in images])
        return images

    def batch_uint8(self, indices: Sequence[int] | np.ndarray) -> torch.Tensor | None:
        """:meth:`batch` as uint8 ``(B, C, H, W)``, a quarter of the bytes for a process to hand
        over (``uint8_batch_to_tensor`` of it is exactly ``batch(indices)``); None when the
        reader does not decode to uint8 or a ``transform`` is set."""
        if self.transform is not None:
            return None
        return self.load_batch_uint8(check_indices(indices, len(self)))

    def batch_to_hand_over(self, indices: Sequence[int] | np.ndarray) -> torch.Tensor:
        """What a decoding process hands over: :meth:`batch_uint8` where the reader decodes to
        uint8, else :meth:`batch`; :func:`as_float_images` of it is exactly ``batch(indices)``."""
        images = self.batch_uint8(indices)
        return self.batch(indices) if images is None else images

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        i = operator.index(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {type(self).__name__} of {n} rows")
        i %= n
        image = self.load_image(i)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[i])

    def subset(self, indices: Sequence[int] | np.ndarray) -> ImageDataset:
        """Rows ``indices`` of this dataset; labels, ``num_classes`` and names are unchanged."""
        return SubsetDataset(self, indices)


class SubsetDataset(ImageDataset):
    """A view on rows of a parent dataset; a subset of a subset points at the root parent."""

    def __init__(self, parent: ImageDataset, indices: Sequence[int] | np.ndarray) -> None:
        rows = check_indices(indices, len(parent))
        if isinstance(parent, SubsetDataset):
            rows, parent = parent.indices[rows], parent.parent
        self.parent = parent
        self.indices = rows
        super().__init__(
            parent.labels[rows], parent.num_classes, parent.class_names, parent.transform
        )

    def load_image(self, index: int) -> torch.Tensor:
        return self.parent.load_image(int(self.indices[index]))

    def load_batch(self, indices: np.ndarray) -> torch.Tensor:
        return self.parent.load_batch(self.indices[indices])

    def load_batch_uint8(self, indices: np.ndarray) -> torch.Tensor | None:
        return self.parent.load_batch_uint8(self.indices[indices])


class ArrayDataset(ImageDataset):
    """In-memory images: uint8 ``(N, H, W)`` (grey) or ``(N, H, W, C)``, labels ``(N,)``."""

    def __init__(
        self,
        images: np.ndarray,
        labels: Sequence[int] | np.ndarray,
        num_classes: int | None = None,
        class_names: Sequence[str] | None = None,
        transform: Transform | None = None,
    ) -> None:
        images = np.asarray(images)
        if images.dtype != np.uint8:
            raise ValueError(f"images must be uint8, got {images.dtype}")
        if images.ndim not in (3, 4):
            raise ValueError(f"images must be (N, H, W) or (N, H, W, C), got shape {images.shape}")
        super().__init__(labels, num_classes, class_names, transform)
        if len(images) != len(self.labels):
            raise ValueError(f"{len(images)} images but {len(self.labels)} labels")
        self.images = images

    def load_image(self, index: int) -> torch.Tensor:
        return uint8_to_tensor(self.images[index])

    def load_batch(self, indices: np.ndarray) -> torch.Tensor:
        return uint8_batch_to_tensor(self.load_batch_uint8(indices))

    def load_batch_uint8(self, indices: np.ndarray) -> torch.Tensor:
        images = torch.from_numpy(self.images[indices])  # a copy: fancy indexing
        if images.ndim == 3:
            images = images[..., None]
        return images.permute(0, 3, 1, 2).contiguous()
