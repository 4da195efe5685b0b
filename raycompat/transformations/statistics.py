"""The sufficient statistics of a linear fit over paired rows, accumulated part by part.

For pairs ``x (N, d_old)``, ``y (N, d_new)`` the least-squares and orthogonal fits
(:mod:`raycompat.transformations.fit`) need only ``count = N``, ``sum_x = X^T 1``,
``sum_y = Y^T 1``, ``sum_sq_x = ||X||_F^2``, ``sum_sq_y = ||Y||_F^2``, the cross-covariance
``cross = X^T Y (d_old, d_new)`` and the Gram matrix ``gram = X^T X (d_old, d_old)``: O(d^2)
memory whatever N, one pass over the rows, and sums, so statistics of parts (one per worker)
:meth:`~PairStatistics.merge` into those of their concatenation. The orthogonal fit needs no
Gram (``gram=False`` halves the work); the affine fit does. The uncentred orthogonal fit (the
default ``procrustes``) needs no column sums either (``sums=False``): it reads only ``count``,
``cross`` and the two sums of squares (its residual ``||X||^2 + ||Y||^2 - 2 tr(W^T C)``).

Precision: the totals are float64. Each block of :data:`BLOCK_ROWS` rows is multiplied in the
rows' own precision (float32 rows: one float32 matrix product per block, BLAS's fastest) and
added to the float64 totals, so the rounding error is that of a ``BLOCK_ROWS``-term float32 sum
(relative ~1e-6), not of an N-term one; give float64 rows for float64 products throughout.

Speed: one loop over the blocks: each block's matrix product, its sums of squares and (when
kept) its column sums. The product is compute-bound; each sum is one more read of the block,
which BLAS cannot fuse into the product, so the column sums are taken only when kept (the
uncentred Procrustes fit keeps none: docs/scale.md, "Issue 53", ``benchmarks/adapters.py``).
All of it runs in torch on the rows' memory (no copy), on torch's intra-op threads: its float32
matrix product is about 15% faster than NumPy's here, and its 1-d dot product is the cheapest
op that both sums the squares and detects a NaN or an infinity (either makes the block's sum
non-finite); only a part where one does is searched row by row, to name the row. No Ray.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from raycompat.transformations.pairs import PairsError, check_pairs, refuse_nonfinite

BLOCK_ROWS = 32768


@dataclass
class PairStatistics:
    """Sums over pairs; build with :meth:`empty` and :meth:`add`, combine with :meth:`merge`."""

    d_old: int
    d_new: int
    count: int
    sum_x: np.ndarray | None  # (d_old,) float64; None (with sum_y) when kept without sums
    sum_y: np.ndarray | None  # (d_new,)
    sum_sq_x: float
    sum_sq_y: float
    cross: np.ndarray  # (d_old, d_new) X^T Y
    gram: np.ndarray | None  # (d_old, d_old) X^T X; None when kept without it

    @classmethod
    def empty(
        cls, d_old: int, d_new: int, *, gram: bool = True, sums: bool = True
    ) -> PairStatistics:
        """No pairs yet; ``gram=False`` keeps no ``X^T X`` (enough for ``procrustes``),
        ``sums=False`` no column sums (enough for the uncentred ``procrustes``; a centred fit,
        the affine fit and the residual of a map with a bias need them)."""
        return cls(
            d_old,
            d_new,
            count=0,
            sum_x=np.zeros(d_old) if sums else None,
            sum_y=np.zeros(d_new) if sums else None,
            sum_sq_x=0.0,
            sum_sq_y=0.0,
            cross=np.zeros((d_old, d_new)),
            gram=np.zeros((d_old, d_old)) if gram else None,
        )

    @classmethod
    def of(cls, x, y, *, gram: bool = True, sums: bool = True, **checks) -> PairStatistics:
        """The statistics of one part ``x (N, d_old)``, ``y (N, d_new)``; ``checks`` as
        :func:`~raycompat.transformations.pairs.check_pairs` takes them (ids, ``where``)."""
        x, y = check_pairs(x, y, finite=False, **checks)  # add checks NaN/inf on the row norms
        return cls.empty(x.shape[1], y.shape[1], gram=gram, sums=sums).add(x, y, **checks)

    @property
    def has_gram(self) -> bool:
        return self.gram is not None

    @property
    def has_sums(self) -> bool:
        return self.sum_x is not None

    def add(self, x_part, y_part, **checks) -> PairStatistics:
        """Add the pairs ``x_part (n, d_old)``, ``y_part (n, d_new)`` in place; return self.

        The part is checked (:func:`check_pairs`: lengths, ids; its widths against these
        statistics) before the pass and for NaN/inf during it, named by row; the part's sums
        are added only after the pass, so a refused part changes nothing.
        """
        x, y = check_pairs(x_part, y_part, finite=False, **checks)
        where = checks.get("where", "pairs")
        if (x.shape[1], y.shape[1]) != (self.d_old, self.d_new):
            raise PairsError(
                f"{where}: widths {x.shape[1]} -> {y.shape[1]}, but these statistics are "
                f"{self.d_old} -> {self.d_new}"
            )
        tx, ty = _tensors(x, y)
        zeros = partial(torch.zeros, dtype=torch.float64)  # this part's sums, kept apart
        cross, sum_x, sum_y = zeros(self.d_old, self.d_new), zeros(self.d_old), zeros(self.d_new)
        gram = None if self.gram is None else zeros(self.d_old, self.d_old)
        squares = [0.0, 0.0]
        for start in range(0, len(x), BLOCK_ROWS):
            xb, yb = tx[start : start + BLOCK_ROWS], ty[start : start + BLOCK_ROWS]
            cross += xb.T @ yb
            if gram is not None:
                gram += xb.T @ xb
            if self.has_sums:  # a read of the block each: only when kept
                ones = torch.ones(len(xb), dtype=xb.dtype)  # column sums as products, as X^T Y
                sum_x += ones @ xb
                sum_y += ones @ yb
            for side, block in enumerate((xb, yb)):
                squares[side] += _block_squares(block, tx, ty, checks)
        # Everything is checked and computed: only now does the part change these statistics.
        self.cross += cross.numpy()
        if self.gram is not None:
            self.gram += gram.numpy()
        if self.has_sums:
            self.sum_x += sum_x.numpy()
            self.sum_y += sum_y.numpy()
        self.sum_sq_x += squares[0]
        self.sum_sq_y += squares[1]
        self.count += len(x)
        return self

    def merge(self, other: PairStatistics) -> PairStatistics:
        """The statistics of both sets of pairs (a new object; associative and commutative up
        to float64 rounding)."""
        if (other.d_old, other.d_new) != (self.d_old, self.d_new):
            raise PairsError(
                f"cannot merge pair statistics of widths {self.d_old} -> {self.d_new} with "
                f"{other.d_old} -> {other.d_new}"
            )
        if other.has_gram != self.has_gram:
            raise PairsError("cannot merge pair statistics kept with and without the Gram matrix")
        if other.has_sums != self.has_sums:
            raise PairsError("cannot merge pair statistics kept with and without column sums")
        sums = self.has_sums
        return PairStatistics(
            self.d_old,
            self.d_new,
            self.count + other.count,
            self.sum_x + other.sum_x if sums else None,
            self.sum_y + other.sum_y if sums else None,
            self.sum_sq_x + other.sum_sq_x,
            self.sum_sq_y + other.sum_sq_y,
            self.cross + other.cross,
            None if self.gram is None else self.gram + other.gram,
        )

    def mean_squared_residual(self, weight: np.ndarray, bias: np.ndarray) -> float | None:
        """``(1/N) ||X W + 1 b^T - Y||_F^2`` from the statistics alone (no rows), for
        ``weight (d_old, d_new)``, ``bias (d_new,)``.

        Expanded: ``tr(W^T G W) + 2 b.(W^T sum_x) + N ||b||^2 - 2 tr(W^T C) - 2 b.sum_y +
        ||Y||^2``. ``tr(W^T G W)`` needs the Gram, except for ``W W^T = I`` (an orthogonal map,
        or a semi-orthogonal one with ``d_old <= d_new``), where it is ``||X||_F^2``; the bias
        terms need the column sums, unless ``b = 0``. None when what it needs was not kept.
        """
        if not self.has_sums and np.any(bias):
            return None
        if self.gram is not None:
            quadratic = float(np.sum(weight * (self.gram @ weight)))
        elif self.d_old <= self.d_new and np.allclose(
            weight @ weight.T, np.eye(self.d_old), atol=1e-5
        ):
            quadratic = self.sum_sq_x
        else:
            return None
        total = quadratic - 2.0 * float(np.sum(weight * self.cross)) + self.sum_sq_y
        if self.has_sums:  # the bias terms (all zero for b = 0)
            total += (
                2.0 * float(bias @ (weight.T @ self.sum_x))
                + self.count * float(bias @ bias)
                - 2.0 * float(bias @ self.sum_y)
            )
        return max(total, 0.0) / self.count


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides as torch tensors on the arrays' memory, in one native dtype (float64 if either
    is); only an array torch cannot view (mixed dtypes, non-contiguous, byte-swapped) is
    copied."""
    dtype = np.float32 if x.dtype == y.dtype == np.float32 else np.float64
    x, y = (np.require(a, dtype=dtype, requirements="C") for a in (x, y))
    with warnings.catch_warnings():  # read-only arrays (Arrow's) are only read here
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(x), torch.from_numpy(y)


def _block_squares(block: torch.Tensor, tx: torch.Tensor, ty: torch.Tensor, checks) -> float:
    """``||block||_F^2`` in float64 from one dot product, ``block`` a block of ``tx`` or ``ty``;
    a non-finite sum means a NaN or an infinity in the part (refused naming its first row) or a
    float32 overflow of finite rows (the block is summed again in float64)."""
    flat = block.reshape(-1)
    total = float(torch.dot(flat, flat))
    if not np.isfinite(total):
        _refuse_nonfinite(tx, ty, checks)
        total = float(np.einsum("i,i->", flat.numpy(), flat.numpy(), dtype=np.float64))
    return total


def _refuse_nonfinite(tx: torch.Tensor, ty: torch.Tensor, checks: dict) -> None:
    """Raise :class:`PairsError` naming the first row of ``x``, then of ``y``, holding a NaN or
    an infinity (the whole part searched, so the row and the count are the part's)."""
    for side, rows in (("x", tx.numpy()), ("y", ty.numpy())):
        norms = np.einsum("ij,ij->i", rows, rows, dtype=np.float64)
        where, ids = checks.get("where", "pairs"), checks.get("x_ids")
        refuse_nonfinite(side, np.isfinite(norms), where, ids)
