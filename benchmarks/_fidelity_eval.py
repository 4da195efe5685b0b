"""Metrics half of ``benchmarks/fidelity.py``: one seed's numbers for one method, their summary
over seeds, and the markdown tables.

Every score is the project's: ``M(t, k)`` is :func:`raycompat.evaluation.score` with the
``identification`` protocol (1:N top-1, cosine, the query excluded by index), AC / AA / ECC /
update gain come from :mod:`raycompat.metrics.compatibility`, flips from
:func:`raycompat.metrics.identification_flips`, backfill curves from
:func:`raycompat.backfill.compare_orders`. Percentages everywhere (one unit); a cell that was
never measured (above the diagonal) is ``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from raycompat.backfill import compare_orders
from raycompat.evaluation import EvalSet, score
from raycompat.metrics import (
    CompatibilityMatrix,
    average_accuracy,
    average_compatibility,
    ecc,
    identification_flips,
    update_gain,
)

PERCENT = 100.0


@dataclass
class Served:
    """One method's features on one evaluation set.

    Attributes:
        queries: ``queries[t]`` = model t's raw ``(N, d)`` features of the N images.
        galleries: ``galleries[t, k]`` = the gallery model t searches when it was extracted by
            model k <= t: ``queries[k]`` for a compatible method, ``h``-transformed forward for
            FCT; ``galleries[t, t] = queries[t]``.
        labels: ``(N,)`` identities.
        query_maps: ``query_maps[t, k]`` = model t's queries mapped into model k's space by a
            query-side map (``_fidelity_maps``); None or a missing key: the queries as they are.
    """

    queries: list[np.ndarray]
    galleries: dict[tuple[int, int], np.ndarray]
    labels: np.ndarray
    query_maps: dict[tuple[int, int], np.ndarray] | None = None

    def query(self, t: int, k: int) -> np.ndarray:
        """Model t's queries as they search model k's gallery: mapped into its space by a
        query-side map (``query_maps[t, k]``), else as they are."""
        return (self.query_maps or {}).get((t, k), self.queries[t])


def compatibility(
    served: Served, protocol: str = "identification", eval_set: EvalSet | None = None
) -> np.ndarray:
    """``(T, T)`` matrix of ``M(t, k)`` as fractions, NaN above the diagonal, under the
    evaluation ``protocol`` (``eval_set``: its pairs; None: the labels alone)."""
    T = len(served.queries)
    out = np.full((T, T), np.nan)
    eval_set = eval_set or EvalSet(labels=served.labels)
    for t in range(T):
        for k in range(t + 1):
            out[t, k] = score(
                protocol, served.query(t, k), served.galleries[t, k], eval_set, "cosine"
            )
    return out


def score_metrics(served: Served, protocol: str, eval_set: EvalSet) -> dict:
    """The matrix, ECC per pair, ECC on every pair, AC and AA of one method under another
    evaluation ``protocol`` (``verification``, ``templates``), reported beside 1:N top-1."""
    return criterion(compatibility(served, protocol, eval_set), protocol)


def criterion(M: np.ndarray, metric: str) -> dict:
    """The lower-triangular matrix ``M`` (T x T, fractions) in percent, ECC per pair and on
    every pair, AC and AA: what every score of a method reports."""
    T = len(M)
    matrix = CompatibilityMatrix.from_array(np.nan_to_num(M), metric=metric)
    passes = [[ecc(M[t, k], M[k, k]) if k < t else None for k in range(T)] for t in range(T)]
    return {
        "matrix": [[_percent(M[t, k]) if k <= t else None for k in range(T)] for t in range(T)],
        "ecc": passes,
        "ecc_all": all(p for row in passes for p in row if p is not None),
        "AC": average_compatibility(matrix),
        "AA": average_accuracy(matrix) * PERCENT,
    }


def re_embedding_share(matrix: list[list[float | None]]) -> dict:
    """The share of a full re-embedding's score that serving the old gallery keeps (issue 51,
    item 4; Drift-Adapter's "share of re-embedding's recall"): ``M(t, k) / M(t, t)`` in percent
    for every ``k < t`` (``matrix`` as :func:`criterion` gives it, in percent), since a full
    backfill would serve model t's queries on model t's own gallery; ``mean``: over those
    pairs. None where ``M(t, t)`` is 0."""
    T = len(matrix)
    kept = [
        [
            PERCENT * matrix[t][k] / matrix[t][t] if k < t and matrix[t][t] else None
            for k in range(T)
        ]
        for t in range(T)
    ]
    cells = [v for row in kept for v in row if v is not None]
    return {"matrix": kept, "mean": sum(cells) / len(cells) if cells else None}


def _percent(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value * PERCENT


def _flips(old_query, old_gallery, new_query, new_gallery, labels) -> dict:
    flips = identification_flips(old_query, old_gallery, new_query, new_gallery, labels)
    of_old = flips.negative / flips.old_accuracy if flips.old_accuracy > 0 else None
    relative = flips.relative_negative
    return {
        "nfr": _percent(flips.negative),
        "pfr": _percent(flips.positive),
        "nfr_of_old_correct": _percent(of_old),
        "relative_nfr": None if math.isnan(relative) else relative,
    }


def _gain(M: np.ndarray, t: int, upper: float) -> float | None:
    if upper == M[t - 1, t - 1]:
        return None
    return update_gain(M[t, t - 1], M[t - 1, t - 1], upper)


def run_metrics(served: Served, upper_self_tests: list[float]) -> dict:
    """One seed's numbers for one method.

    ``upper_self_tests[t]``: M(t, t) of the independently trained model t (the update gain's
    ``M(up, up)``, BCT). Upgrade ``i`` of ``upgrades`` is model ``i + 1`` replacing model ``i``:
    its update gain, and its flips against the old system (old queries on the old gallery) for
    the new queries on the gallery as served (``served``: old rows or ``h(old)``) and after a
    full backfill (``backfilled``: the new model's own gallery): NFR and PFR in percent of all
    queries, NFR in percent of the old system's correct ones, and Yan et al.'s relative NFR
    ``NFR / ((1 - acc_new) acc_old)`` (None when no flip is possible).
    """
    M = compatibility(served)
    T = len(M)
    q, g, labels = served.queries, served.galleries, served.labels
    upgrades = [
        {
            "update_gain": _gain(M, t, upper_self_tests[t]),
            "served": _flips(q[t - 1], q[t - 1], served.query(t, t - 1), g[t, t - 1], labels),
            "backfilled": _flips(q[t - 1], q[t - 1], q[t], q[t], labels),
        }
        for t in range(1, T)
    ]
    return {
        **criterion(M, "top1"),
        "upgrades": upgrades,
        "upgrade_mean": combine(upgrades, mean_leaf),
    }


def average_ranks(values) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (as Spearman's rho needs)."""
    x = np.asarray(values, dtype=np.float64)
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(1, len(x) + 1)
    _, group = np.unique(x, return_inverse=True)
    return (np.bincount(group, ranks) / np.bincount(group))[group]


def spearman(a, b) -> float | None:
    """Spearman's rank correlation; None when either side is constant."""
    ra, rb = average_ranks(a), average_ranks(b)
    if np.ptp(ra) == 0 or np.ptp(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def transformation_error(transformed: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``||normalize(h(old)) - normalize(new)||^2`` per row: the oracle order's error."""

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    return ((unit(transformed.astype(np.float64)) - unit(new.astype(np.float64))) ** 2).sum(1)


def backfill_metrics(new, transformed, uncertainty, labels, random_orders: int) -> dict:
    """FastFill on one upgrade: AUC (over the backfilled fraction, 0 to 1) of top-1 and mAP for
    the ``uncertainty``, ``random`` (mean of ``random_orders`` seeds) and ``oracle`` orders, and
    Spearman's rho between the uncertainty and the true error on this gallery."""
    curves = compare_orders(
        new,
        new,
        transformed,
        labels,
        labels,
        uncertainty,
        random_seeds=tuple(range(random_orders)),
        exclude_self=True,
    )
    out = {
        f"auc_{metric}": {name: c.auc(metric) * PERCENT for name, c in curves.items()}
        for metric in ("top1", "mean_ap")
    }
    out["spearman_gallery"] = spearman(uncertainty, transformation_error(transformed, new))
    return out


def combine(trees: list, leaf):
    """Zip same-shaped trees (dicts, lists, leaves) and apply ``leaf`` to each list of leaves."""
    first = trees[0]
    if isinstance(first, dict):
        return {key: combine([t[key] for t in trees], leaf) for key in first}
    if isinstance(first, list):
        return [combine([t[i] for t in trees], leaf) for i in range(len(first))]
    return leaf(trees)


def mean_leaf(values: list):
    """Mean of the non-None values (booleans: the fraction that is True); None if none."""
    kept = [float(v) for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def summary_leaf(values: list):
    """Over seeds: booleans -> ``{"pass_rate", "n"}``; strings -> ``{"counts": {value: n},
    "n"}``; numbers -> mean, sample sd (None for one value), min, max, n; all None -> None."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    if all(isinstance(v, bool) for v in kept):
        return {"pass_rate": float(np.mean(kept)), "n": len(kept)}
    if all(isinstance(v, str) for v in kept):
        return {"counts": {v: kept.count(v) for v in sorted(set(kept))}, "n": len(kept)}
    arr = np.asarray(kept, dtype=np.float64)
    sd = float(arr.std(ddof=1)) if len(arr) > 1 else None
    return {
        "mean": float(arr.mean()),
        "sd": sd,
        "min": float(arr.min()),
        "max": float(arr.max()),
        "n": len(arr),
    }
