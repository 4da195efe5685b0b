"""FastFill partial backfilling (Jaeckle et al., ICLR 2023), core only (no Ray).

- :mod:`~raycompat.backfill.fit`: FCT's transformation ``h`` with an uncertainty head, trained
  with the uncertainty-weighted loss; ``transform(old) -> (h(old), uncertainty)``.
- :mod:`~raycompat.backfill.curve`: backfill orders (uncertainty, random, oracle) and the
  accuracy-vs-fraction-backfilled curves with their area.
- :mod:`~raycompat.backfill.budget`: budget validation and reading a curve at a budget.

See docs/backfill.md.
"""

from raycompat.backfill.budget import budget_to_reach, check_budget, value_at_budget
from raycompat.backfill.curve import (
    BackfillCurve,
    backfill_curve,
    backfill_order,
    compare_orders,
    mean_curve,
    oracle_order,
    random_order,
)
from raycompat.backfill.fit import UncertainTransformation, fit_uncertain_transformation

__all__ = [
    "BackfillCurve",
    "UncertainTransformation",
    "backfill_curve",
    "backfill_order",
    "budget_to_reach",
    "check_budget",
    "compare_orders",
    "fit_uncertain_transformation",
    "mean_curve",
    "oracle_order",
    "random_order",
    "value_at_budget",
]
