"""Paired rows for a training-free fit: the same items embedded by two models.

A fit of a transformation ``old -> new`` without training (``procrustes``, ``affine``,
``adapter``) reads pairs: row ``i`` of ``x (N, d_old)`` and row ``i`` of ``y (N, d_new)`` are
one item as the transformation's input and as its target. :func:`check_pairs` refuses what
would fit a wrong map, each in one line naming the row: lengths that differ, ids that do not
pair up row by row, a NaN or an infinity. :func:`held_out_split` sets aside the seeded share
of them a fit is judged on. NumPy only; no torch, no Ray.
"""

from __future__ import annotations

import math

import numpy as np

from raycompat.errors import DataError


class PairsError(DataError, ValueError):
    """Paired rows that cannot be fitted: mismatched lengths or ids, NaN/inf, too few pairs."""


def _matrix(values, side: str, where: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 2:
        raise PairsError(f"{where}: {side} is {array.ndim}-d of shape {array.shape}, not (N, d)")
    if array.dtype not in (np.float32, np.float64):
        array = array.astype(np.float64)
    return array


def _row_name(row: int, ids) -> str:
    return f"row {row} (id {ids[row]})" if ids is not None else f"row {row}"


def check_pairs(
    x, y, *, x_ids=None, y_ids=None, where: str = "pairs", finite: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``(x (N, d_old), y (N, d_new))`` as floating NumPy arrays, checked.

    ``x_ids`` and ``y_ids`` (``(N,)`` each, optional) are the ids the two sides were read
    with: row ``i`` of both must be the same item. ``where`` names the source in errors.
    Raises :class:`PairsError` on a shape that is not ``(N, d)``, different lengths, the first
    row whose ids differ, or (unless ``finite=False``: the caller checks with
    :func:`refuse_nonfinite`) the first row holding a NaN or an infinity.
    """
    x, y = _matrix(x, "x", where), _matrix(y, "y", where)
    if len(x) != len(y):
        raise PairsError(
            f"{where}: {len(x)} rows of x but {len(y)} rows of y; pairs are row by row"
        )
    ids = None
    if x_ids is not None or y_ids is not None:
        if x_ids is None or y_ids is None:
            raise PairsError(f"{where}: ids given for one side only; give both or neither")
        x_ids, y_ids = np.asarray(x_ids), np.asarray(y_ids)
        if len(x_ids) != len(x) or len(y_ids) != len(y):
            raise PairsError(
                f"{where}: {len(x_ids)} x ids and {len(y_ids)} y ids for {len(x)} pairs"
            )
        differ = np.flatnonzero(x_ids != y_ids)
        if len(differ):
            row = int(differ[0])
            raise PairsError(
                f"{where}: ids do not pair up at row {row}: x has id {x_ids[row]}, "
                f"y has id {y_ids[row]} ({len(differ)} rows differ)"
            )
        ids = x_ids
    for side, values in (("x", x), ("y", y)):
        if finite:
            refuse_nonfinite(side, np.isfinite(values).all(axis=1), where, ids)
    return x, y


def refuse_nonfinite(side: str, finite_rows: np.ndarray, where: str, ids=None) -> None:
    """Raise :class:`PairsError` naming the first ``False`` of ``finite_rows (N,)``: a row of
    ``side`` holding a NaN or an infinity (or, where a caller tested its squared norm, a value
    too large to square)."""
    if finite_rows.all():
        return
    bad = ~finite_rows
    row = int(np.flatnonzero(bad)[0])
    raise PairsError(
        f"{where}: {side} {_row_name(row, ids)} holds a NaN or an infinity "
        f"({int(bad.sum())} such rows)"
    )


def check_enough_pairs(count: int, d_old: int, d_new: int, kind: str) -> None:
    """At least ``max(d_old, d_new)`` pairs, or the cross-covariance (``procrustes``) and the
    Gram matrix (``affine``) are rank-deficient and the map is not determined by the pairs."""
    needed = max(d_old, d_new)
    if count < needed:
        raise PairsError(
            f"{kind} fit: {count} pairs for widths {d_old} -> {d_new}; it needs at least "
            f"{needed} (the larger width), or the map is not determined by the pairs"
        )


def held_out_split(
    count: int, share: float, minimum: int, keep: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(fit_rows, held_rows)``: a seeded split of ``range(count)`` into the rows a fit sees and
    the rows it is judged on. ``held_rows`` holds ``ceil(share * count)`` rows, at least
    ``minimum``, but never more than half of them nor so many that fewer than ``keep`` (what
    the fit needs) are left; it is empty when ``count <= keep``. Both are sorted."""
    if not 0 < share < 1:
        raise ValueError(f"held-out share must be in (0, 1), got {share}")
    held = min(max(math.ceil(share * count), minimum), count // 2, max(count - keep, 0))
    order = np.random.default_rng(seed).permutation(count)
    return np.sort(order[held:]), np.sort(order[:held])
