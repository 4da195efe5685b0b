"""Training-free fits of a transformation on paired rows (the same items embedded twice).

``x (N, d_old)`` is the transformation's input, ``y (N, d_new)`` its target. The linear fits
read only :class:`~raycompat.transformations.statistics.PairStatistics` (O(d^2), one pass over
the pairs, merged over parts); the adapter trains on the rows, so its caller hands it a bounded
sample of them.

- :func:`fit_procrustes`: ``min ||X W - Y||_F`` over ``W^T W = I`` is ``W = U V^T`` with
  ``C = X^T Y = U S V^T`` (Schoenemann, Psychometrika 1966). For ``d_old != d_new`` the thin
  SVD gives the semi-orthogonal ``W (d_old, d_new)``: orthonormal columns (``d_old > d_new``)
  or rows (``d_old < d_new``). It equals zero-padding the narrower side to ``max(d_old,
  d_new)``, solving the square problem and keeping the first ``d_new`` output columns
  (``tests/transformations/test_procrustes.py`` checks it). ``center=True`` fits
  ``(x - mean_x) W + mean_y`` from the centred ``C - N mean_x mean_y^T`` (Schoenemann and
  Carroll 1970, without the dilation); the default does not centre, so ``h`` is a pure
  isometry and a unit query stays a unit query (for ``d_old <= d_new``).
- :func:`fit_affine`: ``min (1/N) ||X W + 1 b^T - Y||_F^2 + lam ||W^T W - I||_F^2`` (the
  lambda-orthogonality regularisation, Ricci et al., arXiv 2509.16664, on the mean per-pair
  error so ``lam`` does not scale with ``N``). ``b = mean_y - mean_x W`` eliminates the bias;
  what is left reads ``tr(W^T S W) - 2 tr(W^T K) + lam ||W^T W - I||^2`` with the covariances
  ``S = G/N - mean_x mean_x^T``, ``K = C/N - mean_x mean_y^T``. ``lam = 0``: the closed form
  ``W = (S + eps I)^-1 K``, ``eps = 1e-10 tr(S)/d_old`` (a ridge that only guards a singular
  ``S``). ``lam > 0``: quartic, no closed form: L-BFGS in float64 on the same ``S`` and ``K``,
  from the better of the least-squares ``W`` and its nearest orthogonal matrix.
- :func:`fit_adapter`: ``A``, ``b`` by one of the above, then AdamW on the residual MLP
  (:mod:`raycompat.transformations.adapter`), fixed seed, a given number of steps.

No Ray here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raycompat.transformations.adapter import AdapterTransformation
from raycompat.transformations.base import Transformation
from raycompat.transformations.kinds import FITTED_KINDS
from raycompat.transformations.linear import AffineTransformation, ProcrustesTransformation
from raycompat.transformations.pairs import PairsError, check_enough_pairs, check_pairs
from raycompat.transformations.statistics import PairStatistics

RIDGE = 1e-10  # eps of the least-squares solve, relative to the mean variance tr(S)/d_old


@dataclass(frozen=True)
class Fit:
    """A fitted ``transformation`` with what its report shows: the ``pairs`` it was fitted on,
    its mean squared ``residual`` per pair on them (None when the statistics cannot give it)
    and the fit's ``settings``. Save it with ``save_transformation(dir, fit.transformation,
    **fit.info())``."""

    transformation: Transformation
    pairs: int
    residual: float | None
    target_energy: float  # mean ||y||^2 over the pairs: the residual of h = 0
    settings: dict[str, Any]

    @property
    def relative_residual(self) -> float | None:
        """``residual / mean ||y||^2``: the fraction of the target the map leaves."""
        if self.residual is None or self.target_energy == 0:
            return None
        return self.residual / self.target_energy

    def info(self) -> dict[str, Any]:
        return {
            "fit": {
                "pairs": self.pairs,
                "residual": self.residual,
                "relative_residual": self.relative_residual,
                **self.settings,
            }
        }


def _means(stats: PairStatistics) -> tuple[np.ndarray, np.ndarray]:
    return stats.sum_x / stats.count, stats.sum_y / stats.count


def _linear_fit(kind: type, stats: PairStatistics, weight, bias, normalize_output, settings):
    h = kind(stats.d_old, stats.d_new, normalize_output=normalize_output)
    h.set_weights(weight, bias)
    residual = stats.mean_squared_residual(weight, bias)
    return Fit(h.eval(), stats.count, residual, stats.sum_sq_y / stats.count, settings)


def fit_procrustes(
    stats: PairStatistics, *, center: bool = False, normalize_output: bool = False
) -> Fit:
    """The orthogonal (semi-orthogonal) ``W`` closest to mapping ``x`` onto ``y``; see the
    module docstring. Needs at least ``max(d_old, d_new)`` pairs; no Gram."""
    check_enough_pairs(stats.count, stats.d_old, stats.d_new, "procrustes")
    cross, bias = stats.cross, np.zeros(stats.d_new)
    if center:
        mean_x, mean_y = _means(stats)
        cross = cross - stats.count * np.outer(mean_x, mean_y)
    weight = _polar(cross)
    if center:
        bias = mean_y - mean_x @ weight
    settings = {"center": center}
    return _linear_fit(ProcrustesTransformation, stats, weight, bias, normalize_output, settings)


def fit_affine(
    stats: PairStatistics, lam: float = 0.0, *, normalize_output: bool = False, steps: int = 500
) -> Fit:
    """``W``, ``b`` of least squares with the orthogonality penalty ``lam`` (module docstring);
    ``steps`` bounds the L-BFGS iterations of ``lam > 0``. Needs the Gram and at least
    ``max(d_old, d_new)`` pairs."""
    if stats.gram is None:
        raise PairsError("affine fit: these pair statistics were kept without the Gram X^T X")
    if lam < 0:
        raise ValueError(f"affine fit: lam must be >= 0, got {lam}")
    check_enough_pairs(stats.count, stats.d_old, stats.d_new, "affine")
    mean_x, mean_y = _means(stats)
    n = stats.count
    cov_x = stats.gram / n - np.outer(mean_x, mean_x)
    cov_x += RIDGE * max(np.trace(cov_x), 1e-300) / stats.d_old * np.eye(stats.d_old)
    cov_xy = stats.cross / n - np.outer(mean_x, mean_y)
    weight = np.linalg.solve(cov_x, cov_xy)
    if lam > 0:
        weight = _penalised(cov_x, cov_xy, lam, weight, steps)
    bias = mean_y - mean_x @ weight
    settings = {"lam": lam}
    return _linear_fit(AffineTransformation, stats, weight, bias, normalize_output, settings)


def _polar(matrix: np.ndarray) -> np.ndarray:
    """The (semi-)orthogonal ``U V^T`` of ``matrix = U S V^T``."""
    u, _, vt = np.linalg.svd(matrix, full_matrices=False)
    return u @ vt


def _penalised(cov_x, cov_xy, lam: float, least_squares, steps: int) -> np.ndarray:
    """``argmin tr(W^T S W) - 2 tr(W^T K) + lam ||W^T W - I||^2`` by L-BFGS (float64), with
    the gradient ``2 (S W - K) + 4 lam W (W^T W - I)`` written out.

    The penalty is taken on the smaller of ``W^T W`` and ``W W^T``: both have the same
    nonzero spectrum, so they differ by a constant and share their gradient. It starts from
    the best of the least-squares ``W``, its nearest (semi-)orthogonal matrix and Procrustes
    on ``K`` (the limit of a large ``lam`` for square maps), and stops when
    the largest gradient entry falls below 1e-9 of the start's, or after ``steps``."""
    s, k = torch.from_numpy(cov_x), torch.from_numpy(cov_xy)
    tall = k.shape[0] >= k.shape[1]
    eye = torch.eye(min(k.shape), dtype=torch.float64)

    def value_and_gradient(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sw = s @ w
        gap = (w.T @ w if tall else w @ w.T) - eye
        value = (w * sw).sum() - 2 * (w * k).sum() + lam * (gap**2).sum()
        return value, 2 * (sw - k) + 4 * lam * (w @ gap if tall else gap @ w)

    starts = [torch.from_numpy(m) for m in (least_squares, _polar(least_squares), _polar(cov_xy))]
    start = min(starts, key=lambda w: float(value_and_gradient(w)[0]))
    w = start.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS(
        [w],
        lr=1.0,
        max_iter=steps,
        tolerance_grad=1e-9 * float(value_and_gradient(start)[1].abs().max()),
        tolerance_change=1e-16,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        with torch.no_grad():
            value, w.grad = value_and_gradient(w)
        return value

    optimizer.step(closure)
    return w.detach().numpy()


def _residual(h: Transformation, old: torch.Tensor, new: torch.Tensor) -> float:
    """Mean squared ``||h(old) - new||^2`` per pair; leaves ``h`` in eval mode."""
    h.eval()
    with torch.inference_mode():
        return float(((h(old) - new) ** 2).sum(dim=1).mean())


LINEAR_INITS = {"procrustes": fit_procrustes, "affine": fit_affine}


def fit_adapter(
    x,
    y,
    *,
    init: str = "procrustes",
    width: int = 256,
    steps: int = 300,
    batch_size: int = 256,
    lr: float = 1e-3,
    weight_decay: float = 1e-4,
    seed: int = 0,
    normalize_output: bool = False,
    **checks,
) -> Fit:
    """The residual adapter on the pairs ``x (N, d_old)``, ``y (N, d_new)`` (in memory: a
    bounded sample; ``checks`` as :func:`~raycompat.transformations.pairs.check_pairs` takes
    them). ``A``, ``b`` = the ``init`` fit (``"procrustes"`` or ``"affine"`` with lam 0),
    fixed; then ``steps`` AdamW steps on batches of ``batch_size`` pairs drawn with ``seed``,
    minimising the mean squared error. Same arguments and rows, same weights (on one machine).
    """
    if init not in LINEAR_INITS:
        raise ValueError(f"adapter fit: unknown init {init!r}; valid: {', '.join(LINEAR_INITS)}")
    x, y = check_pairs(x, y, **checks)
    stats = PairStatistics.empty(x.shape[1], y.shape[1], gram=init == "affine").add(x, y)
    linear = LINEAR_INITS[init](stats)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        h = AdapterTransformation(
            stats.d_old, stats.d_new, width=width, normalize_output=normalize_output
        )
    h.set_weights(linear.transformation.weight, linear.transformation.bias)
    old = torch.as_tensor(x, dtype=torch.float32)
    new = torch.as_tensor(y, dtype=torch.float32)
    init_residual = _residual(h, old, new)  # the MLP starts at zero: h is the init's map
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(h.mlp.parameters(), lr=lr, weight_decay=weight_decay)
    h.train()
    for _ in range(steps):
        rows = torch.randint(len(old), (min(batch_size, len(old)),), generator=generator)
        loss = ((h(old[rows]) - new[rows]) ** 2).sum(dim=1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    residual = _residual(h, old, new)
    settings = {
        "init": init,
        "init_residual": init_residual,
        "width": width,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "weight_decay": weight_decay,
        "seed": seed,
    }
    return Fit(h, stats.count, residual, stats.sum_sq_y / stats.count, settings)


def _keeps_gram(kind: str, d_x: int, d_y: int) -> bool:
    """Whether the ``kind`` fit from ``d_x`` to ``d_y`` needs the Gram ``X^T X``: the affine fit
    always; Procrustes only for its residual where ``d_x > d_y`` (the map is not an isometry)."""
    return kind == "affine" or (kind == "procrustes" and d_x > d_y)


def fit_statistics(kind: str, stats: PairStatistics, *, lam: float = 0.0) -> Fit:
    """The linear ``kind`` (``procrustes`` or ``affine``, penalty ``lam``) fitted on ``stats``,
    accumulated anywhere (``PairStatistics.merge`` of the parts of many workers)."""
    if kind == "procrustes":
        return fit_procrustes(stats)
    if kind == "affine":
        return fit_affine(stats, lam)
    raise ValueError(f"fit_statistics: {kind!r} is not fitted from statistics (procrustes, affine)")


def fit_kind(kind: str, x, y, *, lam: float = 0.0, seed: int = 0, where: str = "pairs") -> Fit:
    """The ``kind`` map fitted on the pairs ``x (N, d_old)``, ``y (N, d_new)``: the one entry
    point of ``raycompat adapt`` and of the fits on pairs in memory. ``lam``: the affine fit's
    penalty; ``seed``: the adapter's; ``where`` names the pairs in errors."""
    if kind not in FITTED_KINDS:
        raise ValueError(f"fit_kind: {kind!r} is not one of {', '.join(FITTED_KINDS)}")
    if kind == "adapter":
        return fit_adapter(x, y, seed=seed, where=where)
    two_d = np.ndim(x) == np.ndim(y) == 2
    gram = _keeps_gram(kind, np.shape(x)[1], np.shape(y)[1]) if two_d else True
    stats = PairStatistics.of(x, y, gram=gram, where=where)  # checks them
    return fit_statistics(kind, stats, lam=lam)
