"""The sufficient statistics of a linear fit over paired rows, accumulated part by part.

For pairs ``x (N, d_old)``, ``y (N, d_new)`` the least-squares and orthogonal fits
(:mod:`raycompat.transformations.fit`) need only ``count = N``, ``sum_x = X^T 1``,
``sum_y = Y^T 1``, ``sum_sq_x = ||X||_F^2``, ``sum_sq_y = ||Y||_F^2``, the cross-covariance
``cross = X^T Y (d_old, d_new)`` and the Gram matrix ``gram = X^T X (d_old, d_old)``: O(d^2)
memory whatever N, one pass over the rows, and sums, so statistics of parts (one per worker)
:meth:`~PairStatistics.merge` into those of their concatenation. The orthogonal fit needs no
Gram (``gram=False`` halves the work); the affine fit does.

Precision: the totals are float64. Each block of :data:`BLOCK_ROWS` rows is multiplied in the
rows' own precision (float32 rows: one float32 matrix product per block, BLAS's fastest) and
added to the float64 totals, so the rounding error is that of a ``BLOCK_ROWS``-term float32 sum
(relative ~1e-6), not of an N-term one; give float64 rows for float64 products throughout.
NumPy only; no torch, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raycompat.transformations.pairs import PairsError, check_pairs, refuse_nonfinite

BLOCK_ROWS = 8192


@dataclass
class PairStatistics:
    """Sums over pairs; build with :meth:`empty` and :meth:`add`, combine with :meth:`merge`."""

    d_old: int
    d_new: int
    count: int
    sum_x: np.ndarray  # (d_old,) float64
    sum_y: np.ndarray  # (d_new,)
    sum_sq_x: float
    sum_sq_y: float
    cross: np.ndarray  # (d_old, d_new) X^T Y
    gram: np.ndarray | None  # (d_old, d_old) X^T X; None when kept without it

    @classmethod
    def empty(cls, d_old: int, d_new: int, *, gram: bool = True) -> PairStatistics:
        """No pairs yet; ``gram=False`` keeps no ``X^T X`` (enough for ``procrustes``)."""
        return cls(
            d_old,
            d_new,
            count=0,
            sum_x=np.zeros(d_old),
            sum_y=np.zeros(d_new),
            sum_sq_x=0.0,
            sum_sq_y=0.0,
            cross=np.zeros((d_old, d_new)),
            gram=np.zeros((d_old, d_old)) if gram else None,
        )

    @classmethod
    def of(cls, x, y, *, gram: bool = True, **checks) -> PairStatistics:
        """The statistics of one part ``x (N, d_old)``, ``y (N, d_new)``; ``checks`` as
        :func:`~raycompat.transformations.pairs.check_pairs` takes them (ids, ``where``)."""
        x, y = check_pairs(x, y, finite=False, **checks)  # add checks NaN/inf on the row norms
        return cls.empty(x.shape[1], y.shape[1], gram=gram).add(x, y, **checks)

    @property
    def has_gram(self) -> bool:
        return self.gram is not None

    def add(self, x_part, y_part, **checks) -> PairStatistics:
        """Add the pairs ``x_part (n, d_old)``, ``y_part (n, d_new)`` in place; return self.

        The part is checked whole first (:func:`check_pairs`: lengths, ids, NaN/inf, named by
        row) and its widths against these statistics, so a refused part changes nothing.
        """
        x, y = check_pairs(x_part, y_part, finite=False, **checks)
        where = checks.get("where", "pairs")
        if (x.shape[1], y.shape[1]) != (self.d_old, self.d_new):
            raise PairsError(
                f"{where}: widths {x.shape[1]} -> {y.shape[1]}, but these statistics are "
                f"{self.d_old} -> {self.d_new}"
            )
        # The squared row norms, one fused pass a side, are both ||X||^2's terms and the
        # finite check: a NaN or an infinity anywhere in a row makes its norm non-finite.
        norms_x, norms_y = (np.einsum("ij,ij->i", v, v) for v in (x, y))
        ids = checks.get("x_ids")
        refuse_nonfinite("x", np.isfinite(norms_x), where, ids)
        refuse_nonfinite("y", np.isfinite(norms_y), where, ids)
        for start in range(0, len(x), BLOCK_ROWS):
            xb, yb = x[start : start + BLOCK_ROWS], y[start : start + BLOCK_ROWS]
            self.cross += xb.T @ yb
            if self.gram is not None:
                self.gram += xb.T @ xb
            ones = np.ones(len(xb), dtype=xb.dtype)  # column sums as BLAS products, as X^T Y
            self.sum_x += ones @ xb
            self.sum_y += ones.astype(yb.dtype) @ yb
            self.sum_sq_x += float(norms_x[start : start + BLOCK_ROWS].sum(dtype=np.float64))
            self.sum_sq_y += float(norms_y[start : start + BLOCK_ROWS].sum(dtype=np.float64))
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
        return PairStatistics(
            self.d_old,
            self.d_new,
            self.count + other.count,
            self.sum_x + other.sum_x,
            self.sum_y + other.sum_y,
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
        or a semi-orthogonal one with ``d_old <= d_new``), where it is ``||X||_F^2``; None when
        neither is available.
        """
        if self.gram is not None:
            quadratic = float(np.sum(weight * (self.gram @ weight)))
        elif self.d_old <= self.d_new and np.allclose(
            weight @ weight.T, np.eye(self.d_old), atol=1e-5
        ):
            quadratic = self.sum_sq_x
        else:
            return None
        total = (
            quadratic
            + 2.0 * float(bias @ (weight.T @ self.sum_x))
            + self.count * float(bias @ bias)
            - 2.0 * float(np.sum(weight * self.cross))
            - 2.0 * float(bias @ self.sum_y)
            + self.sum_sq_y
        )
        return max(total, 0.0) / self.count
