"""What a FastFill partial backfill would buy, measured on features in memory (no Ray).

After an FCT upgrade with an uncertain ``h`` the gallery can hold ``h(phi_old)`` with any
fraction of its rows re-extracted by the new model. :func:`backfill_evaluation` scores the
new model's queries against such galleries of the same images (query set = gallery set, the
query excluded by index: the identification protocol) for the three orders of
:func:`raycompat.backfill.compare_orders`: FastFill's (most uncertain first), random (mean over
a few seeds) and the oracle (largest true error first), and summarises each curve: its areas,
its accuracy at the configured budget, and the budget that reaches ``target`` x new/new top-1.

The upgrade job runs it on the test images (``Outcome.backfill``, the report's "Partial
backfill" section); FCT sweeps run it on the validation images (the ``backfill_*``
objectives of :mod:`raycompat.cluster.tune.objectives`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raycompat.backfill import budget_to_reach, compare_orders, value_at_budget
from raycompat.config.upgrade import PartialBackfillSpec

ORDERS = ("uncertainty", "random", "oracle")
RANDOM_SEEDS = (0, 1, 2)


def backfill_evaluation(
    new: np.ndarray,
    transformed: np.ndarray,
    uncertainty: np.ndarray,
    labels: np.ndarray,
    spec: PartialBackfillSpec,
    *,
    distance: str = "cosine",
    random_seeds: Sequence[int] = RANDOM_SEEDS,
    fractions: Sequence[float] | None = None,
) -> dict:
    """Backfill curves of one gallery of N images, as plain JSON-ready numbers.

    Args:
        new: ``(N, d)`` new-model features: the queries, and the backfilled gallery rows.
        transformed: ``(N, d)`` ``h(phi_old)`` of the same images (the stored rows, mapped).
        uncertainty: ``(N,)`` h's uncertainty of each row (larger = backfilled first).
        labels: ``(N,)`` identity labels.
        spec: the budget the summaries are read at and the ``target`` fraction of new/new.
    Returns:
        ``fractions``, ``budget``, ``target``, ``order`` (the configured one),
        ``random_seeds``, ``curves`` (order -> ``top1``, ``mean_ap`` lists) and ``summary``
        (order -> ``auc_top1``, ``auc_mean_ap``, ``top1_at_budget``, ``mean_ap_at_budget``,
        ``budget_for_target``: the smallest grid fraction whose top-1 reaches
        ``target * new/new``, None if none does).
    """
    labels = np.asarray(labels)
    curves = compare_orders(
        new,
        new,
        transformed,
        labels,
        labels,
        uncertainty,
        fractions,
        random_seeds=tuple(random_seeds),
        distance=distance,
        exclude_self=True,
    )
    out = {
        "fractions": [float(f) for f in curves["uncertainty"].fractions],
        "budget": spec.budget,
        "target": spec.target,
        "order": spec.order,
        "random_seeds": [int(s) for s in random_seeds],
        "curves": {},
        "summary": {},
    }
    for order in ORDERS:
        curve = curves[order]
        out["curves"][order] = {"top1": curve.top1.tolist(), "mean_ap": curve.mean_ap.tolist()}
        out["summary"][order] = {
            "auc_top1": curve.auc("top1"),
            "auc_mean_ap": curve.auc("mean_ap"),
            "top1_at_budget": value_at_budget(curve, spec.budget, "top1"),
            "mean_ap_at_budget": value_at_budget(curve, spec.budget, "mean_ap"),
            "budget_for_target": budget_to_reach(curve, spec.target * curve.top1[-1], "top1"),
        }
    return out
