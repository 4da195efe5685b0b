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
- :func:`fit_adapter`: ``A``, ``b`` by one of the above on all but a held-out share of the
  rows, then AdamW on the residual MLP (:mod:`raycompat.transformations.adapter`) early
  stopped on that share (:mod:`raycompat.transformations.adapter_training`); never worse than
  its init there. ``slerp`` is fitted by :mod:`raycompat.transformations.slerp_fit`.

No Ray here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raycompat.transformations.adapter import AdapterTransformation
from raycompat.transformations.adapter_training import (
    TrainingBudget,
    held_out_residual,
    train_residual,
)
from raycompat.transformations.base import Transformation
from raycompat.transformations.kinds import FITTED_KINDS
from raycompat.transformations.linear import AffineTransformation, ProcrustesTransformation
from raycompat.transformations.pairs import (
    PairsError,
    check_enough_pairs,
    check_pairs,
    held_out_split,
)
from raycompat.transformations.statistics import PairStatistics

RIDGE = 1e-10  # eps of the least-squares solve, relative to the mean variance tr(S)/d_old
MIN_HELD_OUT = 32  # the fewest held-out pairs the adapter is judged on (when it has them)


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
    module docstring. Needs at least ``max(d_old, d_new)`` pairs; no Gram, and the column sums
    only for ``center=True``."""
    if center and not stats.has_sums:
        raise PairsError(
            "centred procrustes fit: these pair statistics were kept without column sums"
        )
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
    if not stats.has_sums:
        raise PairsError("affine fit: these pair statistics were kept without column sums")
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


LINEAR_INITS = {"procrustes": fit_procrustes, "affine": fit_affine}


def fit_adapter(
    x,
    y,
    *,
    init: str = "affine",
    width: int = 256,
    held_out: float = 0.1,
    seed: int = 0,
    normalize_output: bool = False,
    **options,
) -> Fit:
    """The residual adapter on the pairs ``x (N, d_old)``, ``y (N, d_new)`` (in memory: a
    bounded sample), trained to convergence on a held-out share of them.

    A seeded share ``held_out`` of the pairs (at least :data:`MIN_HELD_OUT`, at most half) is
    held out; ``A``, ``b`` = the ``init`` fit (``"procrustes"`` or ``"affine"`` with lam 0) on
    the rest, fixed; then the MLP trains on the rest with AdamW under a cosine schedule, early
    stopped on the held-out pairs, within a step and a wall-time cap (``options``: the fields
    of :class:`~raycompat.transformations.adapter_training.TrainingBudget`, e.g. ``steps``,
    ``lr``, ``max_seconds``; the others are
    :func:`~raycompat.transformations.pairs.check_pairs`'s). It keeps the best weights seen on
    the held-out pairs, and returns the init itself (the MLP at zero) unless those beat it
    there: never worse than its linear init on the held-out pairs. Same arguments and rows,
    same weights on one machine, unless the wall-time cap stops it. ``settings`` records the
    held-out residuals of the init and of the result, the steps run and why it stopped.
    """
    if init not in LINEAR_INITS:
        raise ValueError(f"adapter fit: unknown init {init!r}; valid: {', '.join(LINEAR_INITS)}")
    budget_keys = set(TrainingBudget.__dataclass_fields__)
    budget = TrainingBudget(**{k: v for k, v in options.items() if k in budget_keys})
    x, y = check_pairs(x, y, **{k: v for k, v in options.items() if k not in budget_keys})
    check_enough_pairs(len(x), x.shape[1], y.shape[1], "adapter")
    fit_rows, held_rows = held_out_split(
        len(x), held_out, MIN_HELD_OUT, max(x.shape[1], y.shape[1]), seed
    )
    affine = init == "affine"  # procrustes: uncentred, no Gram, no sums
    stats = PairStatistics.empty(x.shape[1], y.shape[1], gram=affine, sums=affine)
    linear = LINEAR_INITS[init](stats.add(x[fit_rows], y[fit_rows]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        h = AdapterTransformation(
            x.shape[1], y.shape[1], width=width, normalize_output=normalize_output
        )
    h.set_weights(linear.transformation.weight, linear.transformation.bias)
    old = torch.as_tensor(x, dtype=torch.float32)
    new = torch.as_tensor(y, dtype=torch.float32)
    train, held = (old[fit_rows], new[fit_rows]), (old[held_rows], new[held_rows])
    settings = {"init": init, "width": width, "held_out_pairs": len(held_rows), "seed": seed}
    settings.update({k: getattr(budget, k) for k in sorted(budget_keys)})
    if len(held_rows) == 0:  # nothing to judge the MLP on: keep the init
        settings.update(init_held_out_residual=None, held_out_residual=None, steps_run=0)
        settings["stopped"] = "no held-out pairs: the linear init"
    else:
        init_held = held_out_residual(h, *held)  # the MLP starts at zero: h is the init
        run = train_residual(h, train, held, budget, seed)
        kept = run.best < init_held
        if not kept:
            _zero_last_layer(h)
        settings.update(
            init_held_out_residual=init_held,
            held_out_residual=run.best if kept else init_held,
            steps_run=run.steps,
            best_step=run.best_step if kept else 0,
            stopped=run.stopped if kept else f"{run.stopped}; not better than the linear init",
            seconds=round(run.seconds, 3),
        )
    residual = held_out_residual(h, old, new)
    return Fit(h, len(x), residual, float((y.astype(np.float64) ** 2).sum(axis=1).mean()), settings)


def _zero_last_layer(h: AdapterTransformation) -> None:
    """The MLP back to zero output: ``h`` is exactly its linear term again."""
    with torch.no_grad():
        h.mlp[2].weight.zero_()
        h.mlp[2].bias.zero_()


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
    raise ValueError(
        f"fit_statistics: {kind!r} is not fitted from statistics (procrustes, affine): it "
        "needs the rows (fit_kind)"
    )


def fit_kind(kind: str, x, y, *, lam: float = 0.0, seed: int = 0, where: str = "pairs") -> Fit:
    """The ``kind`` map fitted on the pairs ``x (N, d_old)``, ``y (N, d_new)``: the one entry
    point of ``raycompat adapt`` and of the fits on pairs in memory. ``lam``: the affine fit's
    penalty; ``seed``: the held-out split of the adapter and of slerp; ``where`` names the
    pairs in errors."""
    if kind not in FITTED_KINDS:
        raise ValueError(f"fit_kind: {kind!r} is not one of {', '.join(FITTED_KINDS)}")
    if kind == "adapter":
        return fit_adapter(x, y, seed=seed, where=where)
    if kind == "slerp":
        from raycompat.transformations.slerp_fit import fit_slerp  # it imports this module

        return fit_slerp(x, y, seed=seed, where=where)
    two_d = np.ndim(x) == np.ndim(y) == 2
    gram = _keeps_gram(kind, np.shape(x)[1], np.shape(y)[1]) if two_d else True
    sums = kind == "affine"  # the uncentred Procrustes fit reads no column sums
    stats = PairStatistics.of(x, y, gram=gram, sums=sums, where=where)  # checks them
    return fit_statistics(kind, stats, lam=lam)
