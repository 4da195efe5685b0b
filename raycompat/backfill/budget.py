"""Backfill budgets: the fraction of the gallery re-extracted with the new model, in [0, 1].

:func:`check_budget` validates one (it lives in the torch-free :mod:`raycompat.config.checks`,
so the upgrade job's config check needs neither torch nor this package); :func:`value_at_budget`
reads a :class:`~raycompat.backfill.curve.BackfillCurve` at a budget (linear interpolation
between grid points); :func:`budget_to_reach` gives the smallest grid budget whose accuracy
reaches a target, e.g. 95% of the new/new value ``curve.values(metric)[-1]`` on a grid ending
at 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from raycompat.config.checks import check_budget

if TYPE_CHECKING:
    from raycompat.backfill.curve import BackfillCurve


def value_at_budget(curve: BackfillCurve, budget: float, metric: str = "mean_ap") -> float:
    """``metric`` after backfilling a fraction ``budget``, interpolated linearly on the grid."""
    budget = check_budget(budget)
    lo, hi = float(curve.fractions[0]), float(curve.fractions[-1])
    if not lo <= budget <= hi:
        raise ValueError(f"budget {budget} is outside the curve's grid [{lo}, {hi}]")
    return float(np.interp(budget, curve.fractions, curve.values(metric)))


def budget_to_reach(curve: BackfillCurve, target: float, metric: str = "mean_ap") -> float | None:
    """The smallest grid fraction whose ``metric`` is >= ``target``; None if none reaches it."""
    if not math.isfinite(target):
        raise ValueError(f"target must be finite, got {target!r}")
    reached = np.nonzero(curve.values(metric) >= target)[0]
    return float(curve.fractions[reached[0]]) if reached.size else None
