"""Backfill budgets: the fraction of the gallery re-extracted with the new model, in [0, 1].

:func:`check_budget` validates one; :func:`value_at_budget` reads a
:class:`~raycompat.backfill.curve.BackfillCurve` at a budget (linear interpolation between grid
points); :func:`budget_to_reach` gives the smallest grid budget whose accuracy reaches a target,
e.g. 95% of the new/new value ``curve.values(metric)[-1]`` on a grid ending at 1.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

from raycompat.config import ConfigError

if TYPE_CHECKING:
    from raycompat.backfill.curve import BackfillCurve


def check_budget(budget, name: str = "budget") -> float:
    """``budget`` as a float in [0, 1]; raises :class:`ConfigError` (a ValueError) naming
    ``name`` for a non-number, NaN, a negative value or a value above 1."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise ConfigError(f"{name} must be a number in [0, 1], got {budget!r}")
    value = float(budget)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be a fraction of the gallery in [0, 1], got {value!r}")
    return value


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
