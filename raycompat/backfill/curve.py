"""Partial-backfill orders and accuracy curves (FastFill, Jaeckle et al., ICLR 2023).

A backfill replaces stored ``h(phi_old)`` gallery rows by new-model embeddings, one row at a
time in a chosen ``order``. :func:`backfill_curve` scores new-model queries against the gallery
after the first ``round(f * G)`` rows of ``order`` were backfilled, for every fraction ``f`` of a
grid, with the project's metrics (:func:`~raycompat.metrics.retrieval.cmc` top-1 and
:func:`~raycompat.metrics.retrieval.mean_average_precision`, FCT's mAP@1.0), so ``f = 0`` is
the new/h(old) cross-test and ``f = 1`` the new/new self-test.

Orders: :func:`backfill_order` (most uncertain first: FastFill's), :func:`random_order` (the
baseline), :func:`oracle_order` (largest true transformation error first: evaluation only, it
needs the new embeddings it is meant to save). :func:`compare_orders` scores the three.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from raycompat.backfill.budget import check_budget
from raycompat.index.distances import Distance, as_features, get_distance
from raycompat.metrics.retrieval import cmc, mean_average_precision

METRICS = ("top1", "mean_ap")


@dataclass(frozen=True)
class BackfillCurve:
    """Accuracy against the fraction of the gallery backfilled.

    Attributes:
        fractions: ``(F,)`` increasing grid in [0, 1]; counts: ``(F,)`` rows backfilled at each.
        top1, mean_ap: ``(F,)`` identification top-1 and mAP at each fraction.
    """

    fractions: np.ndarray
    counts: np.ndarray
    top1: np.ndarray
    mean_ap: np.ndarray

    def values(self, metric: str = "mean_ap") -> np.ndarray:
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
        return getattr(self, metric)

    def auc(self, metric: str = "mean_ap") -> float:
        """Area under the curve by the trapezoid rule, divided by the grid's span (so that a
        flat curve's area is its value); on ``linspace(0, 1, F)`` that is the area over [0, 1]."""
        span = float(self.fractions[-1] - self.fractions[0])
        values = self.values(metric)
        if span == 0:
            return float(values[0])
        return float(np.trapezoid(values, self.fractions) / span)

    def mean(self, metric: str = "mean_ap") -> float:
        """Mean over the grid points: FastFill's summary (mean mAP over the backfill steps)."""
        return float(np.mean(self.values(metric)))


def backfill_order(uncertainty) -> np.ndarray:
    """Row indices ``(N,)`` int64, most uncertain first; ties by ascending row index."""
    u = np.asarray(uncertainty, dtype=np.float64)
    if u.ndim != 1:
        raise ValueError(f"uncertainty must have shape (N,), got {u.shape}")
    nan = np.isnan(u)
    if nan.any():
        raise ValueError(
            f"uncertainty has {int(nan.sum())} NaN value(s), first at row "
            f"{int(np.argmax(nan))}: no backfill order can be drawn from it"
        )
    return np.argsort(-u, kind="stable").astype(np.int64)


def random_order(n: int, seed: int) -> np.ndarray:
    """A seeded random permutation of ``n`` rows (the baseline order)."""
    return np.random.default_rng(seed).permutation(n).astype(np.int64)


def oracle_order(gallery_transformed, gallery_new, distance: str | Distance = "cosine"):
    """Rows by true transformation error ``||h(old) - new||^2`` (largest first), measured on
    the features ``distance`` compares (L2-normalised for cosine). Evaluation only."""
    dist = get_distance(distance)
    h = dist.prepare(gallery_transformed, "gallery_transformed")
    new = dist.prepare(gallery_new, "gallery_new")
    if h.shape != new.shape:
        raise ValueError(f"gallery shapes differ: {tuple(h.shape)} vs {tuple(new.shape)}")
    return backfill_order((h.double() - new.double()).pow(2).sum(dim=1).cpu().numpy())


def _check_fractions(fractions) -> np.ndarray:
    grid = np.asarray(fractions, dtype=np.float64)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"fractions must be a non-empty 1-D grid, got shape {grid.shape}")
    for i, f in enumerate(grid):
        check_budget(float(f), f"fractions[{i}]")
    if np.any(np.diff(grid) <= 0):
        raise ValueError(f"fractions must be strictly increasing, got {grid.tolist()}")
    return grid


def backfill_curve(
    query_new,
    gallery_new,
    gallery_transformed,
    query_labels,
    gallery_labels,
    order,
    fractions=None,
    *,
    distance: str | Distance = "cosine",
    exclude_self: bool = False,
    chunk_size: int | None = None,
) -> BackfillCurve:
    """Score new-model queries against a gallery backfilled in ``order``.

    Args:
        query_new: ``(Q, d)`` new-model query embeddings; labels ``(Q,)``, ``(G,)``.
        gallery_new, gallery_transformed: ``(G, d)`` new-model and ``h(old)`` embeddings of the
            same gallery images, row for row.
        order: ``(G,)`` permutation of the gallery rows, first backfilled first.
        fractions: increasing grid in [0, 1], default ``linspace(0, 1, 11)``; at ``f`` the
            first ``round(f * G)`` rows of ``order`` hold new embeddings.
        distance, exclude_self, chunk_size: as in :mod:`raycompat.metrics.retrieval`
            (``exclude_self=True``: query i IS gallery item i, the same-set protocol of
            :func:`raycompat.evaluation.identification`).
    """
    grid = _check_fractions(np.linspace(0.0, 1.0, 11) if fractions is None else fractions)
    new = as_features(gallery_new, "gallery_new")
    transformed = as_features(gallery_transformed, "gallery_transformed")
    if new.shape != transformed.shape:
        raise ValueError(
            f"gallery_new {tuple(new.shape)} and gallery_transformed {tuple(transformed.shape)} "
            f"must be the same images in the same space"
        )
    g = new.shape[0]
    order = np.asarray(order)
    if order.shape != (g,) or not np.array_equal(np.sort(order), np.arange(g)):
        raise ValueError(f"order must be a permutation of the {g} gallery rows")
    order_t = torch.as_tensor(order.astype(np.int64), device=new.device)
    counts = np.rint(grid * g).astype(np.int64)
    top1, mean_ap = [], []
    for k in counts:
        gallery = transformed.clone()
        rows = order_t[:k]
        gallery[rows] = new[rows].to(gallery.dtype)
        args = (query_new, gallery, query_labels, gallery_labels)
        options = dict(distance=distance, exclude_self=exclude_self, chunk_size=chunk_size)
        top1.append(cmc(*args, topk=(1,), **options)[1])
        mean_ap.append(mean_average_precision(*args, **options))
    return BackfillCurve(grid, counts, np.asarray(top1), np.asarray(mean_ap))


def mean_curve(curves: Sequence[BackfillCurve]) -> BackfillCurve:
    """Point-wise mean of curves on the same grid (e.g. random orders over several seeds)."""
    if not curves:
        raise ValueError("mean_curve needs at least one curve")
    for c in curves[1:]:
        if not np.array_equal(c.fractions, curves[0].fractions):
            raise ValueError("mean_curve: the curves have different fraction grids")
    return BackfillCurve(
        curves[0].fractions,
        curves[0].counts,
        np.mean([c.top1 for c in curves], axis=0),
        np.mean([c.mean_ap for c in curves], axis=0),
    )


def compare_orders(
    query_new,
    gallery_new,
    gallery_transformed,
    query_labels,
    gallery_labels,
    uncertainty,
    fractions=None,
    *,
    random_seeds: Sequence[int] = (0, 1, 2, 3, 4),
    distance: str | Distance = "cosine",
    exclude_self: bool = False,
    chunk_size: int | None = None,
) -> dict[str, BackfillCurve]:
    """``{"uncertainty", "random", "oracle"}`` curves; "random" is the mean over
    ``random_seeds``. Arguments as in :func:`backfill_curve`; ``uncertainty`` is ``(G,)``."""
    if not random_seeds:
        raise ValueError("random_seeds must name at least one seed")
    g = np.asarray(uncertainty).shape[0]

    pairs = (query_new, gallery_new, gallery_transformed, query_labels, gallery_labels)
    options = dict(distance=distance, exclude_self=exclude_self, chunk_size=chunk_size)
    curve = partial(backfill_curve, *pairs, fractions=fractions, **options)  # curve(order)

    return {
        "uncertainty": curve(backfill_order(uncertainty)),
        "random": mean_curve([curve(random_order(g, seed)) for seed in random_seeds]),
        "oracle": curve(oracle_order(gallery_transformed, gallery_new, distance)),
    }
