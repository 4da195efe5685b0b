"""Negative flips: what a model update breaks that the old model got right.

Yan et al., "Positive-Congruent Training: Towards Regression-Free Model Updates" (CVPR 2021),
eq. 1: over ``N`` test samples,

    NFR = (1/N) * #{i : old correct on i and new wrong on i}
    PFR = (1/N) * #{i : old wrong on i and new correct on i}

so ``acc_new - acc_old = PFR - NFR``: an update can gain accuracy and still break many
samples. Yan et al. also report the *relative* NFR, ``NFR / ((1 - acc_new) * acc_old)``, the
flips measured against what independent errors of the two models would give (1 means the new
model's errors fall on the old model's hits as if at random).

For retrieval, "correct" is a top-1 hit (:func:`raycompat.metrics.retrieval.top1_hits`): the
old system is the old model's queries against the old gallery, the new one the new model's
queries against whatever gallery it is served (the stored one for backward compatibility, the
transformed one for FCT, a re-extracted one after a backfill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Flips:
    """Flip rates of one update over ``n`` samples (fractions in [0, 1])."""

    n: int
    old_accuracy: float
    new_accuracy: float
    negative: float  # NFR: old right, new wrong
    positive: float  # PFR: old wrong, new right

    @property
    def negative_of_old_hits(self) -> float:
        """NFR as a share of the samples the old system got right: #(old right, new wrong) /
        #(old right); NaN when the old system got none right."""
        return self.negative / self.old_accuracy if self.old_accuracy > 0 else float("nan")

    @property
    def relative_negative(self) -> float:
        """NFR / ((1 - acc_new) * acc_old); NaN when either factor is 0 (no flip is possible)."""
        expected = (1.0 - self.new_accuracy) * self.old_accuracy
        return self.negative / expected if expected > 0 else float("nan")

    def to_dict(self) -> dict[str, float]:
        return {"n": self.n, "old_accuracy": self.old_accuracy, "new_accuracy": self.new_accuracy,
                "negative_flip_rate": self.negative, "positive_flip_rate": self.positive,
                "negative_flip_rate_of_old_hits": self.negative_of_old_hits,
                "relative_negative_flip_rate": self.relative_negative}


def flip_rates(old_correct: Any, new_correct: Any, valid: Any | None = None) -> Flips:
    """Flip rates from per-sample correctness of the old and the new system.

    Args:
        old_correct, new_correct: ``(N,)`` booleans, the same samples in the same order.
        valid: ``(N,)`` booleans, the samples to count (e.g. queries that have a match); all
            of them when None.
    """
    old, new = np.asarray(old_correct, dtype=bool), np.asarray(new_correct, dtype=bool)
    if old.shape != new.shape or old.ndim != 1:
        raise ValueError(f"old and new correctness must be two (N,) arrays, got {old.shape} "
                         f"and {new.shape}")
    keep = np.ones_like(old) if valid is None else np.asarray(valid, dtype=bool)
    if keep.shape != old.shape:
        raise ValueError(f"valid must be ({old.shape[0]},), got {keep.shape}")
    n = int(keep.sum())
    if n == 0:
        raise ValueError("no sample to count flips on")
    old, new = old[keep], new[keep]
    return Flips(n, float(old.mean()), float(new.mean()), float((old & ~new).mean()),
                 float((~old & new).mean()))


def identification_flips(
    old_query: Any, old_gallery: Any, new_query: Any, new_gallery: Any, labels: Any,
    distance: str = "cosine",
) -> Flips:
    """Flips of the identification protocol (query ``i`` is gallery item ``i``, excluded by
    index): old queries against the old gallery vs new queries against the gallery the new
    model is served. Queries without a match in the gallery are left out."""
    from raycompat.metrics.retrieval import top1_hits

    old, valid = top1_hits(old_query, old_gallery, labels, labels, distance, exclude_self=True)
    new, _ = top1_hits(new_query, new_gallery, labels, labels, distance, exclude_self=True)
    return flip_rates(old, new, valid)
