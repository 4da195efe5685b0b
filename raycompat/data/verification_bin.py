"""insightface verification files (``lfw.bin``, ``cfp_fp.bin``, ``agedb_30.bin``), read safely.

Layout (insightface ``lfw2pack.py``): a pickle of ``(bins, issame_list)``. ``bins`` holds ``2P``
encoded images (JPEG/PNG ``bytes``); images ``2i`` and ``2i + 1`` form pair ``i``, and
``issame_list[i]`` (a bool) says whether they show the same person. insightface scores these
files with ``KFold(n_splits=10, shuffle=False)``: consecutive blocks of pairs, which for
``lfw.bin`` are exactly the 10 folds of ``pairs.txt`` it was packed from.

A pickle is a program: ``pickle.load`` imports any global the file names and calls it. The
unpickler here refuses every global, so loading can only build bytes, strings, numbers, bools,
lists, tuples, dicts and sets, never an object with behaviour; the loaded value is then checked
to be exactly ``(list of bytes, list of bool)``. Files written by Python 2 store images as ``str``,
read back as ``bytes`` with ``encoding="bytes"``. A file written by Python 3 with pickle protocol
2 or lower stores bytes through the global ``_codecs.encode`` and is refused; re-save it with
``protocol=pickle.HIGHEST_PROTOCOL`` as insightface does.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from raycompat.data.base import CorruptDataError, ImageDataset, Transform
from raycompat.data.image_folder import as_hw, decode_images, read_image
from raycompat.data.lfw import LFWPairs


class UnsafePickleError(CorruptDataError):
    """The pickle asks to import a global (a class or function); nothing was executed."""


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Refuses every ``GLOBAL``/``STACK_GLOBAL``/``INST``/``OBJ``/``EXT`` (they all resolve through
    :meth:`find_class`) and every persistent id, so no callable ever reaches ``REDUCE``."""

    def __init__(self, handle, name: str) -> None:
        super().__init__(handle, encoding="bytes")
        self.name = name

    def find_class(self, module: str, name: str):
        raise UnsafePickleError(
            f"{self.name}: pickle refers to global '{module}.{name}'; "
            f"only bytes, lists, tuples and bools are allowed"
        )

    def persistent_load(self, pid):
        raise UnsafePickleError(f"{self.name}: pickle uses a persistent id; not allowed")


def _type_name(value: object) -> str:
    return type(value).__name__


def read_verification_bin(path: str | os.PathLike) -> tuple[list[bytes], np.ndarray]:
    """Load and check an insightface ``.bin``.

    Returns:
        ``(images, same)``: ``2P`` encoded images (pair ``i`` is ``images[2i], images[2i+1]``)
        and ``(P,)`` bool.
    Raises:
        UnsafePickleError: the pickle names a global (nothing was imported or called).
        CorruptDataError: truncated, trailing bytes, or not ``(list of bytes, list of bool)``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"verification file not found: {path} (expected an insightface .bin such as lfw.bin)"
        )
    with open(path, "rb") as handle:
        try:
            loaded = _NoGlobalsUnpickler(handle, str(path)).load()
        except UnsafePickleError:
            raise
        except Exception as error:  # no global was resolved, so any error is a malformed stream
            raise CorruptDataError(
                f"{path}: not a complete pickle (truncated, or not an insightface .bin): "
                f"{type(error).__name__}: {error}"
            ) from error
        if handle.read(1):
            raise CorruptDataError(f"{path}: unexpected bytes after the end of the pickle")
    return _check_structure(loaded, path)


def _check_structure(loaded: object, path: Path) -> tuple[list[bytes], np.ndarray]:
    if not isinstance(loaded, tuple | list) or len(loaded) != 2:
        found = _type_name(loaded)
        if isinstance(loaded, tuple | list):
            found += f" of {len(loaded)} items"
        raise CorruptDataError(
            f"{path}: expected a pickled (bins, issame_list) pair, found {found}"
        )
    bins, issame = loaded
    for value, what in ((bins, "bins"), (issame, "issame_list")):
        if not isinstance(value, list | tuple):
            raise CorruptDataError(f"{path}: {what} must be a list, found {_type_name(value)}")
    images: list[bytes] = []
    for i, image in enumerate(bins):
        if not isinstance(image, bytes | bytearray):
            raise CorruptDataError(
                f"{path}: bins[{i}] is {_type_name(image)}, expected bytes (an encoded image)"
            )
        if not image:
            raise CorruptDataError(f"{path}: bins[{i}] is empty")
        images.append(bytes(image))
    # insightface writes Python bools; an int 0/1 here means another writer, so refuse it rather
    # than guess what other values would mean.
    for i, same in enumerate(issame):
        if type(same) is not bool:
            raise CorruptDataError(
                f"{path}: issame_list[{i}] is {_type_name(same)} {same!r}, expected a bool"
            )
    if not issame:
        raise CorruptDataError(f"{path}: holds no pairs")
    if len(images) != 2 * len(issame):
        raise CorruptDataError(
            f"{path}: {len(images)} images for {len(issame)} pairs; expected 2 per pair "
            f"({2 * len(issame)})"
        )
    return images, np.asarray(issame, dtype=bool)


def consecutive_folds(num_pairs: int, num_folds: int) -> np.ndarray:
    """``(P,)`` fold ids of sklearn ``KFold(num_folds, shuffle=False)``: consecutive blocks, the
    first ``P % num_folds`` one pair longer."""
    if not 2 <= num_folds <= num_pairs:
        raise ValueError(f"num_folds must be in [2, {num_pairs} pairs], got {num_folds}")
    sizes = np.full(num_folds, num_pairs // num_folds)
    sizes[: num_pairs % num_folds] += 1
    return np.repeat(np.arange(num_folds, dtype=np.int64), sizes)


class EncodedImageDataset(ImageDataset):
    """Images held in memory as encoded bytes, decoded with Pillow on access."""

    def __init__(
        self,
        images: Sequence[bytes],
        labels: Sequence[int] | np.ndarray,
        name: str,
        image_size: int | Sequence[int] | None = None,
        mode: str = "RGB",
        transform: Transform | None = None,
    ) -> None:
        super().__init__(labels, transform=transform)
        if len(images) != len(self.labels):
            raise ValueError(f"{len(images)} images but {len(self.labels)} labels")
        self.images = list(images)
        self.name = name
        self.image_size = as_hw(image_size)
        self.mode = mode

    def load_image(self, index: int) -> torch.Tensor:
        return read_image(
            self.images[index],
            mode=self.mode,
            size=self.image_size,
            name=f"{self.name} bins[{index}]",
        )

    def load_batch(self, indices: np.ndarray) -> torch.Tensor:
        rows = indices.tolist()
        return decode_images(
            [self.images[i] for i in rows],
            mode=self.mode,
            size=self.image_size,
            names=[f"{self.name} bins[{i}]" for i in rows],
        )


def pair_labels(same: np.ndarray) -> np.ndarray:
    """``(2P,)`` pseudo-identities: the two images of a matched pair share a label, every other
    image has its own. The file stores no names, so this is all that is known about identity."""
    per_image = np.ones(2 * len(same), dtype=np.int64)
    per_image[1::2] = ~same  # the right image starts a new label unless it matches the left
    return np.cumsum(per_image) - 1


def load_verification_bin(
    path: str | os.PathLike,
    image_size: int | Sequence[int] | None = None,
    mode: str = "RGB",
    transform: Transform | None = None,
    num_folds: int = 10,
) -> LFWPairs:
    """Verification pairs of an insightface ``.bin`` as :class:`LFWPairs` (same use as
    :func:`raycompat.data.load_lfw`).

    ``images`` has all ``2P`` stored images (a face in several pairs is stored several times),
    labelled with :func:`pair_labels`; ``left = 2i``, ``right = 2i + 1``; folds are insightface's
    ``num_folds`` consecutive blocks. Only the verification protocol is meaningful on it.
    """
    images, same = read_verification_bin(path)
    dataset = EncodedImageDataset(images, pair_labels(same), str(path), image_size, mode, transform)
    left = np.arange(0, 2 * len(same), 2, dtype=np.int64)
    folds = consecutive_folds(len(same), num_folds)
    return LFWPairs(dataset, left, left + 1, same, folds, num_folds)
