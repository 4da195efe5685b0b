"""LFW 1:1 verification pairs (``pairs.txt``) and the images they use.

``pairs.txt`` starts with ``n_folds n_per_fold`` ("10 300"; the dev files have a single number,
read as one fold). Each fold then lists ``n_per_fold`` matched pairs ``name i j`` followed by
``n_per_fold`` mismatched pairs ``name1 i name2 j``. Image ``i`` of ``name`` is
``<root>/<name>/<name>_<iiii>.jpg``. The 10-fold protocol (threshold chosen on 9 folds, accuracy
on the 10th) is in the metrics package; this module only reads the data (CoReS sec. 7.4).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raycompat.data.base import CorruptDataError, ImageDataset, Transform
from raycompat.data.image_folder import FileImageDataset


@dataclass(frozen=True)
class PairsFile:
    """Parsed ``pairs.txt``: ``P`` rows of image references (name, number) per side."""

    left: list[tuple[str, int]]
    right: list[tuple[str, int]]
    same: np.ndarray  # (P,) bool
    fold: np.ndarray  # (P,) int64
    line: np.ndarray  # (P,) int64, 1-based line number in the file
    num_folds: int


@dataclass(frozen=True)
class LFWPairs:
    """Verification pairs as indices into ``images`` (for ``pairs.txt``: the unique images,
    labelled by identity; for an insightface ``.bin``: every stored image, see
    :mod:`raycompat.data.verification_bin`)."""

    images: ImageDataset
    left: np.ndarray  # (P,) int64
    right: np.ndarray  # (P,) int64
    same: np.ndarray  # (P,) bool
    fold: np.ndarray  # (P,) int64
    num_folds: int


def lfw_image_path(root: str | os.PathLike, name: str, number: int) -> Path:
    return Path(root) / name / f"{name}_{number:04d}.jpg"


def parse_pairs(path: str | os.PathLike) -> PairsFile:
    """Read a ``pairs.txt``; errors name the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"LFW pairs file not found: {path} (expected pairs.txt with "
            f"'n_folds n_per_fold' then the pairs)"
        )
    lines = [(n, line.split()) for n, line in enumerate(path.read_text().splitlines(), 1)]
    lines = [(n, fields) for n, fields in lines if fields]
    if not lines or not 1 <= len(lines[0][1]) <= 2 or not all(f.isdigit() for f in lines[0][1]):
        raise CorruptDataError(f"{path}:1: expected 'n_folds n_per_fold' header")
    header = [int(f) for f in lines[0][1]]
    num_folds, per_fold = header if len(header) == 2 else (1, header[0])
    body = lines[1:]
    if len(body) != 2 * num_folds * per_fold:
        raise CorruptDataError(
            f"{path}: header announces {num_folds} folds x {2 * per_fold} pairs"
            f" = {2 * num_folds * per_fold} lines, found {len(body)}"
        )
    left, right, same, numbers = [], [], [], []
    for row, (number, fields) in enumerate(body):
        matched = row % (2 * per_fold) < per_fold
        numbers_at = (1, 2) if matched else (1, 3)
        if len(fields) != numbers_at[1] + 1 or not all(fields[i].isdigit() for i in numbers_at):
            kind = "'name i j'" if matched else "'name1 i name2 j'"
            raise CorruptDataError(f"{path}:{number}: expected a {kind} pair, got {fields}")
        if matched:
            left.append((fields[0], int(fields[1])))
            right.append((fields[0], int(fields[2])))
        else:
            left.append((fields[0], int(fields[1])))
            right.append((fields[2], int(fields[3])))
        same.append(matched)
        numbers.append(number)
    fold = np.arange(len(body), dtype=np.int64) // (2 * per_fold)
    return PairsFile(
        left,
        right,
        np.asarray(same, dtype=bool),
        fold,
        np.asarray(numbers, dtype=np.int64),
        num_folds,
    )


def load_lfw(
    root: str | os.PathLike,
    pairs_path: str | os.PathLike | None = None,
    image_size: int | Sequence[int] | None = None,
    mode: str = "RGB",
    transform: Transform | None = None,
) -> LFWPairs:
    """Pairs of ``pairs_path`` (default ``<root>/pairs.txt``) over the images under ``root``.

    Every referenced image must exist (checked here, so a bad layout fails before evaluation).
    The unique images are sorted by (name, number); labels index the sorted identity names.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"LFW root not found: {root} (expected <root>/<name>/<name>_0001.jpg)"
        )
    pairs = parse_pairs(pairs_path if pairs_path is not None else root / "pairs.txt")
    first_line: dict[tuple[str, int], int] = {}
    for side in (pairs.left, pairs.right):
        for ref, line in zip(side, pairs.line.tolist(), strict=True):
            first_line[ref] = min(line, first_line.get(ref, line))
    unique = sorted(first_line)
    for ref in unique:
        if not lfw_image_path(root, *ref).is_file():
            raise FileNotFoundError(
                f"LFW image not found: {lfw_image_path(root, *ref)} "
                f"(used by line {first_line[ref]} of the pairs file)"
            )
    names = sorted({name for name, _ in unique})
    label_of = {name: i for i, name in enumerate(names)}
    row_of = {ref: i for i, ref in enumerate(unique)}
    images = FileImageDataset(
        [str(lfw_image_path(root, *ref)) for ref in unique],
        [label_of[name] for name, _ in unique],
        len(names),
        names,
        image_size,
        mode,
        transform,
    )
    left = np.asarray([row_of[ref] for ref in pairs.left], dtype=np.int64)
    right = np.asarray([row_of[ref] for ref in pairs.right], dtype=np.int64)
    return LFWPairs(images, left, right, pairs.same, pairs.fold, pairs.num_folds)
