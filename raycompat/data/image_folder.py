"""Class-per-subfolder images (``root/<class>/<image>``) and the image decoders of every reader.

Class names are the sub-folder names in sorted order; label ``i`` is the ``i``-th name. This is
the layout of ImageNet, CUB-200, TinyImageNet and of CASIA-WebFace once unpacked to folders.

Two decoders give the same pixels: :func:`read_image` (one image, Pillow; what training reads
through ``dataset[i]``) and :func:`decode_images` (a batch; what extraction reads through
``dataset.batch(rows)``), which hands complete JPEGs to torchvision's libjpeg-turbo.
"""

from __future__ import annotations

import io
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from raycompat.data.base import (
    CorruptDataError,
    ImageDataset,
    Transform,
    uint8_batch_to_tensor,
    uint8_to_tensor,
)

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")


def as_hw(size: int | Sequence[int] | None) -> tuple[int, int] | None:
    """``112`` -> ``(112, 112)``; ``(h, w)`` unchanged; None stays None."""
    if size is None:
        return None
    hw = (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size)
    if len(hw) != 2 or min(hw) <= 0:
        raise ValueError(f"image_size must be a positive int or (height, width), got {size!r}")
    return hw


def read_image(
    source: str | os.PathLike | bytes,
    *,
    mode: str = "RGB",
    size: tuple[int, int] | None = None,
    name: str | None = None,
) -> torch.Tensor:
    """Decode an image file (path) or encoded bytes to a float tensor ``(C, H, W)`` in [0, 1].

    Args:
        source: a path, or the encoded bytes (JPEG/PNG/...).
        mode: Pillow mode to convert to ("RGB" -> C=3, "L" -> C=1).
        size: ``(H, W)`` to resize to (bilinear), or None to keep the stored size.
        name: what to call the image in errors (defaults to the path).
    """
    return uint8_to_tensor(_pillow_decode(source, mode, size, name or str(source)))


def _pillow_decode(
    source: str | os.PathLike | bytes, mode: str, size: tuple[int, int] | None, name: str
) -> np.ndarray:
    """Pillow: decode, ``convert(mode)``, bilinear resize -> uint8 ``(H, W)`` or ``(H, W, C)``."""
    handle = io.BytesIO(source) if isinstance(source, bytes | bytearray | memoryview) else source
    try:
        with Image.open(handle) as image:
            image = image.convert(mode)
            if size is not None and image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            return np.asarray(image, dtype=np.uint8)
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {name}") from None
    except (OSError, ValueError, SyntaxError) as error:  # UnidentifiedImageError is an OSError
        raise CorruptDataError(f"cannot decode image {name}: {error}") from error


# Pillow's RGB -> L weights (ITU-R 601-2 luma, 16-bit fixed point, Convert.c ``L24``)
_LUMA = torch.tensor([19595, 38470, 7471], dtype=torch.int32).view(3, 1, 1)


def decode_images(
    sources: Sequence[bytes | bytearray | memoryview],
    *,
    mode: str = "RGB",
    size: tuple[int, int] | None = None,
    names: Sequence[str] | None = None,
) -> torch.Tensor:
    """Decode a batch of encoded images to float ``(B, C, H, W)`` in [0, 1]: equal to
    ``torch.stack([read_image(s, mode=mode, size=size) for s in sources])``, bit for bit.

    Complete JPEGs (SOI ... EOI) are decoded by torchvision's libjpeg-turbo, which returns
    Pillow's RGB pixels exactly (``tests/data/test_readers.py`` checks baseline, progressive,
    grey, CMYK and subsampled files); "L" applies Pillow's own integer luma formula to them.
    Everything else goes through Pillow as in :func:`read_image`: PNG (torchvision 0.29's PNG
    decoder crashes the process on a PNG with a bad CRC), other formats, truncated JPEGs
    (libjpeg pads them with grey where Pillow refuses them), JPEGs libjpeg rejects (Pillow gives
    the error message) and modes other than RGB/L. Resizing is Pillow's bilinear filter on the
    decoded uint8 pixels, as in training: torchvision's faster uint8 resize differs from it by
    1/255 on ~3% of the pixels, which would skew served embeddings against trained ones.

    Args:
        sources: encoded image bytes.
        mode: "RGB" (C=3) or "L" (C=1); any other Pillow mode is decoded image by image.
        size: ``(H, W)`` to resize to, or None (then every image must have the same size).
        names: what to call each image in errors (default ``"image <i> of the batch"``).

    Raises:
        CorruptDataError: an image cannot be decoded (the message names it).
        ValueError: images of different sizes and no ``size``.
    """
    names = names if names is not None else [f"image {i} of the batch" for i in range(len(sources))]
    if mode not in UINT8_MODES:
        return torch.stack(
            [
                read_image(s, mode=mode, size=size, name=n)
                for s, n in zip(sources, names, strict=True)
            ]
        )
    return uint8_batch_to_tensor(decode_images_uint8(sources, mode, size, names))


UINT8_MODES = ("RGB", "L")  # what decode_images_uint8 decodes; others go through read_image


def decode_images_uint8(
    sources: Sequence[bytes], mode: str, size: tuple[int, int] | None, names: Sequence[str]
) -> torch.Tensor:
    """:func:`decode_images` for a mode in :data:`UINT8_MODES`, before the widening: the uint8
    ``(B, C, H, W)`` pixels."""
    images = []
    with warnings.catch_warnings():
        # torchvision 0.29 marks its image codecs deprecated (successor: torchcodec); the
        # pinned torchvision keeps them, and the parity tests guard a future swap
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)  # frombuffer on read-only bytes: only read
        for data, name in zip(sources, names, strict=True):
            image = _libjpeg_decode(data, mode) if _complete_jpeg(data) else None
            if image is None:  # not a complete JPEG, or libjpeg failed: Pillow decides
                array = _pillow_decode(data, mode, size, name)
                image = torch.from_numpy(array if array.ndim == 3 else array[:, :, None])
                images.append(image.permute(2, 0, 1))
                continue
            if size is not None and tuple(image.shape[1:]) != tuple(size):
                image = _pillow_resize(image, size)
            images.append(image)
    shapes = {tuple(image.shape) for image in images}
    if len(shapes) > 1:
        first = next(i for i, image in enumerate(images) if image.shape != images[0].shape)
        raise ValueError(
            f"images of one batch must share a size: {names[0]} is "
            f"{tuple(images[0].shape)}, {names[first]} is {tuple(images[first].shape)} "
            f"(C, H, W); set an image_size"
        )
    return torch.stack(images)


def _complete_jpeg(data: bytes | bytearray | memoryview) -> bool:
    return len(data) > 4 and bytes(data[:3]) == b"\xff\xd8\xff" and bytes(data[-2:]) == b"\xff\xd9"


def _libjpeg_decode(data: bytes | bytearray | memoryview, mode: str) -> torch.Tensor | None:
    """uint8 ``(C, H, W)`` from torchvision's libjpeg-turbo, or None where it fails."""
    # imported on the first JPEG: importing torchvision costs about as much as importing torch,
    # which sources without JPEGs need not pay in every actor
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        rgb = decode_jpeg(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB)
    except RuntimeError:
        return None
    if mode == "RGB":
        return rgb
    luma = (rgb.to(torch.int32) * _LUMA).sum(0, keepdim=True)
    return luma.add_(0x8000).bitwise_right_shift_(16).to(torch.uint8)


def _pillow_resize(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Pillow's bilinear resize of a uint8 ``(C, H, W)`` image (C = 1 or 3) to ``(H', W')``."""
    array = image.permute(1, 2, 0).numpy()
    pil = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    resized = np.asarray(pil.resize((size[1], size[0]), Image.Resampling.BILINEAR))
    return torch.from_numpy(resized.reshape(size[0], size[1], -1)).permute(2, 0, 1)


def scan_class_folders(
    root: str | os.PathLike, extensions: Sequence[str] = IMAGE_EXTENSIONS
) -> tuple[list[str], list[str], np.ndarray]:
    """Walk ``root/<class>/<file>``. Returns ``(class_names, paths, labels (N,) int64)``.

    Classes and files are sorted by name so that labels do not depend on the file system.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"image folder root {root} does not exist; expected one sub-folder per class"
        )
    extensions = tuple(e.lower() for e in extensions)
    class_names = sorted(
        e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")
    )
    if not class_names:
        raise FileNotFoundError(f"no class sub-folders in {root}; expected {root}/<class>/<image>")
    paths: list[str] = []
    counts = []
    for name in class_names:
        files = sorted(
            e.name
            for e in os.scandir(root / name)
            if e.is_file() and e.name.lower().endswith(extensions)
        )
        if not files:
            raise FileNotFoundError(
                f"class folder {root / name} holds no image ({', '.join(extensions)})"
            )
        paths.extend(str(root / name / f) for f in files)
        counts.append(len(files))
    labels = np.repeat(np.arange(len(class_names), dtype=np.int64), counts)
    logger.debug("found %d images in %d classes under %s", len(paths), len(class_names), root)
    return class_names, paths, labels


class EncodedImages(ImageDataset):
    """A reader of encoded images (files, RecordIO records) that decodes a batch in one call:
    subclasses set ``mode`` and ``image_size`` and give :meth:`encoded` (the batch's bytes and
    what to call each image in errors)."""

    mode: str
    image_size: tuple[int, int] | None

    def encoded(self, indices: np.ndarray) -> tuple[list[bytes], list[str]]:
        raise NotImplementedError

    def load_batch(self, indices: np.ndarray) -> torch.Tensor:
        encoded, names = self.encoded(indices)
        return decode_images(encoded, mode=self.mode, size=self.image_size, names=names)

    def load_batch_uint8(self, indices: np.ndarray) -> torch.Tensor | None:
        if self.mode not in UINT8_MODES:
            return None
        encoded, names = self.encoded(indices)
        return decode_images_uint8(encoded, self.mode, self.image_size, names)


class FileImageDataset(EncodedImages):
    """Images read from ``paths`` (one file each) with given labels."""

    def __init__(
        self,
        paths: Sequence[str],
        labels: Sequence[int] | np.ndarray,
        num_classes: int | None = None,
        class_names: Sequence[str] | None = None,
        image_size: int | Sequence[int] | None = None,
        mode: str = "RGB",
        transform: Transform | None = None,
    ) -> None:
        super().__init__(labels, num_classes, class_names, transform)
        if len(paths) != len(self.labels):
            raise ValueError(f"{len(paths)} image paths but {len(self.labels)} labels")
        self.paths = list(paths)
        self.image_size = as_hw(image_size)
        self.mode = mode

    def load_image(self, index: int) -> torch.Tensor:
        return read_image(self.paths[index], mode=self.mode, size=self.image_size)

    def encoded(self, indices: np.ndarray) -> tuple[list[bytes], list[str]]:
        paths = [self.paths[i] for i in indices.tolist()]
        encoded = []
        for path in paths:
            try:
                encoded.append(Path(path).read_bytes())
            except FileNotFoundError:
                raise FileNotFoundError(f"image file not found: {path}") from None
        return encoded, paths


class ImageFolder(FileImageDataset):
    """``root/<class>/<image>``; labels follow the sorted class names (``class_names``)."""

    def __init__(
        self,
        root: str | os.PathLike,
        image_size: int | Sequence[int] | None = None,
        mode: str = "RGB",
        extensions: Sequence[str] = IMAGE_EXTENSIONS,
        transform: Transform | None = None,
    ) -> None:
        class_names, paths, labels = scan_class_folders(root, extensions)
        super().__init__(paths, labels, len(class_names), class_names, image_size, mode, transform)
        self.root = Path(root)
