"""Sweep objectives, computed on the VALIDATION compatibility matrix (never the test split).

Each objective has a final value (from the run's validation matrix) and a per-epoch proxy that
ASHA compares between trials at the same training iteration: the CoReS selection score
(self-test + 1 when the epoch satisfies ECC against the previous model) for compatibility
objectives, the validation self-test for accuracy objectives.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from raycompat.evaluation import selection_score
from raycompat.metrics.compatibility import CompatibilityMatrix
from raycompat.registry import Registry

OBJECTIVES: Registry = Registry("sweep objective")
PROXY = {
    "AC": "selection_score",
    "ACA": "selection_score",
    "ecc_self_test": "selection_score",
    "AA": "val_self_test",
    "self_test": "val_self_test",
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


def objective(name: str) -> Callable[[dict, CompatibilityMatrix], float]:
    return OBJECTIVES.get(name)
