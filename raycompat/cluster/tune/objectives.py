"""Sweep objectives, computed on the VALIDATION compatibility matrix (never the test split).

Each objective has a final value (from the run's validation matrix) and a per-epoch proxy that
ASHA compares between trials at the same training iteration: the CoReS selection score
(self-test + 1 when the epoch satisfies ECC against the previous model) for compatibility
objectives, the validation self-test for accuracy objectives, the validation cross-test for
``cross_test`` and the partial-backfill objectives (whose ``h`` is learned after training).

The partial-backfill objectives (FCT sweeps with a ``backfill`` section) read the trial's
validation backfill curve, which :func:`raycompat.cluster.tune.fct.transformed_val_matrix` puts in
the
summary (:func:`raycompat.cluster.tune.fct.backfill_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from raycompat.evaluation import selection_score
from raycompat.metrics.compatibility import CompatibilityMatrix, update_gain
from raycompat.registry import Registry

OBJECTIVES: Registry = Registry("sweep objective")
PROXY = {
    "AC": "selection_score",
    "ACA": "selection_score",
    "ecc_self_test": "selection_score",
    "AA": "val_self_test",
    "self_test": "val_self_test",
    "update_gain": "selection_score",
    "cross_test": "val_cross_test",
    "backfill_auc": "val_cross_test",
    "backfill_top1_at_budget": "val_cross_test",
}


def _needs_two(matrix: CompatibilityMatrix, name: str) -> None:
    if len(matrix) < 2:
        raise ValueError(f"objective {name} needs at least two models in the sequence")


def _summary_metric(name: str) -> Callable[[dict, CompatibilityMatrix], float]:
    def value(summary: dict, matrix: CompatibilityMatrix) -> float:
        _needs_two(matrix, name)
        return float(summary[name])

    value.__doc__ = f"{name} of the validation matrix (needs two models)."
    return value


for _name in ("AC", "AA", "ACA"):
    OBJECTIVES.register(_name)(_summary_metric(_name))


@OBJECTIVES.register("self_test")
def self_test(summary: dict, matrix: CompatibilityMatrix) -> float:
    """The last model's self-test M(T, T)."""
    return float(np.diag(matrix.as_array())[-1])


@OBJECTIVES.register("ecc_self_test")
def ecc_self_test(summary: dict, matrix: CompatibilityMatrix) -> float:
    """CoReS model-selection rule: best self-test subject to ECC against the previous model."""
    c = matrix.as_array()
    if len(c) < 2:
        return selection_score(float(c[-1, -1]), None, None)[0]
    return selection_score(float(c[-1, -1]), float(c[-1, -2]), float(c[-2, -2]))[0]


@OBJECTIVES.register("cross_test")
def cross_test(summary: dict, matrix: CompatibilityMatrix) -> float:
    """The last model's queries against the previous model's gallery, M(T, T-1) (the number
    NI-FCL's tables report)."""
    _needs_two(matrix, "cross_test")
    return float(matrix.as_array()[-1, -2])


@OBJECTIVES.register("update_gain")
def update_gain_objective(summary: dict, matrix: CompatibilityMatrix) -> float:
    """Update gain of the last model over the previous one (BCT; CoReS eq. 4), with the last
    model's own self-test standing for M(up, up) (a sweep trains no joint upper bound):
    (M(T, T-1) - M(T-1, T-1)) / (M(T, T) - M(T-1, T-1)); NaN when undefined (such a trial
    cannot win)."""
    _needs_two(matrix, "update_gain")
    c = matrix.as_array()
    try:
        return update_gain(float(c[-1, -2]), float(c[-2, -2]), float(c[-1, -1]))
    except ValueError:
        return float("nan")


def _backfill_metric(name: str, doc: str) -> Callable[[dict, CompatibilityMatrix], float]:
    def value(summary: dict, matrix: CompatibilityMatrix) -> float:
        if name not in summary:
            raise ValueError(
                f"objective {name} needs the validation backfill curve: an FCT sweep with a "
                "'backfill:' section"
            )
        return float(summary[name])

    value.__doc__ = doc
    return value


OBJECTIVES.register("backfill_auc")(
    _backfill_metric(
        "backfill_auc",
        "FastFill's summary of the budget/accuracy trade-off: the area under the validation "
        "top-1 curve over [0, 1] re-extracted, most uncertain rows first.",
    )
)
OBJECTIVES.register("backfill_top1_at_budget")(
    _backfill_metric(
        "backfill_top1_at_budget",
        "Validation top-1 after re-extracting the fraction backfill.budget of the gallery, "
        "most uncertain rows first.",
    )
)


def objective(name: str) -> Callable[[dict, CompatibilityMatrix], float]:
    return OBJECTIVES.get(name)
