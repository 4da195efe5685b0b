"""Evaluation metrics: compatibility matrix scalars, 1:1 verification, 1:N retrieval, CKA.

``M(t, k)`` (query model t, gallery model k) comes from :mod:`.verification` (CoReS) or
:mod:`.retrieval` (HOC, FCT, NI-FCL); a :class:`CompatibilityMatrix` collects them and
:func:`compatibility_report` turns it into AC / AA / ACA / BC / FC.
"""

from raycompat.metrics.cka import linear_cka
from raycompat.metrics.compatibility import (
    CompatibilityMatrix,
    average_accuracy,
    average_accuracy_tau,
    average_compatibility,
    average_compatibility_accuracy,
    average_compatibility_accuracy_tau,
    average_compatibility_tau,
    backward_compatibility,
    compatibility_report,
    ecc,
    forward_compatibility,
    update_gain,
)
from raycompat.metrics.flips import Flips, flip_rates, identification_flips
from raycompat.metrics.retrieval import (
    cmc,
    map_at_r,
    mean_average_precision,
    template_identification,
    top1_hits,
)
from raycompat.metrics.verification import (
    best_threshold,
    make_pairs,
    pair_distances,
    verification_accuracy,
)

__all__ = [
    "CompatibilityMatrix",
    "Flips",
    "flip_rates",
    "identification_flips",
    "top1_hits",
    "average_accuracy",
    "average_accuracy_tau",
    "average_compatibility",
    "average_compatibility_accuracy",
    "average_compatibility_accuracy_tau",
    "average_compatibility_tau",
    "backward_compatibility",
    "best_threshold",
    "cmc",
    "compatibility_report",
    "ecc",
    "forward_compatibility",
    "linear_cka",
    "make_pairs",
    "map_at_r",
    "mean_average_precision",
    "pair_distances",
    "template_identification",
    "update_gain",
    "verification_accuracy",
]
