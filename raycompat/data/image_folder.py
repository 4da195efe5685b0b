"""Class-per-subfolder images (``root/<class>/<image>``), decoded with Pillow.

Class names are the sub-folder names in sorted order; label ``i`` is the ``i``-th name. This is
the layout of ImageNet, CUB-200, TinyImageNet and of CASIA-WebFace once unpacked to folders.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from raycompat.data.base import CorruptDataError, ImageDataset, Transform, uint8_to_tensor

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
    name = name or str(source)
    handle = io.BytesIO(source) if isinstance(source, bytes | bytearray | memoryview) else source
    try:
        with Image.open(handle) as image:
            image = image.convert(mode)
            if size is not None and image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            array = np.asarray(image, dtype=np.uint8)
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {name}") from None
    except (OSError, ValueError, SyntaxError) as error:  # UnidentifiedImageError is an OSError
        raise CorruptDataError(f"cannot decode image {name}: {error}") from error
    return uint8_to_tensor(array)


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
    logger.info("found %d images in %d classes under %s", len(paths), len(class_names), root)
    return class_names, paths, labels


class FileImageDataset(ImageDataset):
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
