"""The ``"slerp"`` kind's fit: Procrustes on unit rows, then ``alpha`` on held-out support pairs.

:func:`fit_slerp` takes a seeded held-out share of the support pairs ``x (N, d_old)``, ``y (N,
d_new)``, fits ``R`` by orthogonal Procrustes (Schoenemann 1966; the paper's closed form,
uncentred, on L2-normalised rows) on the rest, and scores each ``alpha`` of the grid
``0, 1/(grid-1), ..., 1`` on the held-out pairs: the share of held-out items whose own target
is the nearest (cosine) of all held-out targets to ``h(x)`` (top-1, the paper's Recall@1
selection), ties broken by the smaller mean squared residual to the unit targets, then by the
larger ``alpha`` (nearer Procrustes alone). ``alpha = 1`` is on the grid, so on the held-out
pairs the chosen map retrieves at least as well as Procrustes alone. ``R`` is then refitted on
all the pairs, with the chosen ``alpha``. The held-out scores are computed a block of queries
at a time, never as one full matrix. No Ray here.
"""

from __future__ import annotations

import numpy as np
import torch

from raycompat.transformations.fit import MIN_HELD_OUT, Fit, fit_procrustes
from raycompat.transformations.pairs import check_enough_pairs, check_pairs, held_out_split
from raycompat.transformations.slerp import SlerpTransformation
from raycompat.transformations.statistics import PairStatistics

BLOCK = 1024  # held-out queries scored at a time


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows / np.maximum(norms, 1e-12)).astype(np.float32)


def _fitted(x: np.ndarray, y: np.ndarray, alpha: float) -> SlerpTransformation:
    h = SlerpTransformation(x.shape[1], y.shape[1])
    h.set_weights(
        fit_procrustes(PairStatistics.of(x, y, gram=False, sums=False)).transformation.weight,
        np.zeros(y.shape[1]),
    )
    h.set_alpha(alpha)
    return h.eval()


def _scores(h: SlerpTransformation, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """``(top-1, mean squared residual)`` of ``h`` on the pairs ``x``, ``y`` (unit rows)."""
    hits, residual = 0, 0.0
    with torch.inference_mode():
        for start in range(0, len(x), BLOCK):
            q = h(x[start : start + BLOCK])
            own = torch.arange(start, start + len(q))
            hits += int((torch.argmax(q @ y.T, dim=1) == own).sum())
            residual += float(((q - y[own]) ** 2).sum())
    return hits / len(x), residual / len(x)


def fit_slerp(x, y, *, held_out: float = 0.2, grid: int = 21, seed: int = 0, **checks) -> Fit:
    """The ``slerp`` map on the support pairs ``x (N, d_old)``, ``y (N, d_new)`` (in memory;
    ``checks`` as :func:`~raycompat.transformations.pairs.check_pairs` takes them); see the
    module docstring. ``settings`` records ``alpha``, the held-out top-1 and residual of the
    chosen ``alpha`` and of Procrustes alone (``alpha = 1``)."""
    if grid < 2:
        raise ValueError(f"slerp fit: grid must be >= 2, got {grid}")
    x, y = check_pairs(x, y, **checks)
    check_enough_pairs(len(x), x.shape[1], y.shape[1], "slerp")
    unit_x, unit_y = _unit(x), _unit(y)
    fit_rows, held_rows = held_out_split(
        len(x), held_out, MIN_HELD_OUT, max(x.shape[1], y.shape[1]), seed
    )
    settings = {"held_out": held_out, "held_out_pairs": len(held_rows), "grid": grid}
    alpha = 1.0
    if len(held_rows):
        h = _fitted(unit_x[fit_rows], unit_y[fit_rows], 1.0)
        held_x, held_y = torch.from_numpy(unit_x[held_rows]), torch.from_numpy(unit_y[held_rows])
        scored = {}
        for a in np.round(np.linspace(0.0, 1.0, grid), 6):
            h.set_alpha(float(a))
            scored[float(a)] = _scores(h, held_x, held_y)
        alpha = max(scored, key=lambda a: (scored[a][0], -scored[a][1], a))
        settings.update(
            held_out_top1=scored[alpha][0],
            held_out_residual=scored[alpha][1],
            procrustes_held_out_top1=scored[1.0][0],
            procrustes_held_out_residual=scored[1.0][1],
        )
    h = _fitted(unit_x, unit_y, alpha)
    settings["alpha"] = alpha
    with torch.inference_mode():
        mapped = h(torch.as_tensor(x, dtype=torch.float32)).numpy().astype(np.float64)
    residual = float(((mapped - y) ** 2).sum(axis=1).mean())
    return Fit(h, len(x), residual, float((y.astype(np.float64) ** 2).sum(axis=1).mean()), settings)
