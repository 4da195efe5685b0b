"""Evaluation protocols: one number ``M(query model, gallery model)`` from two feature sets.

Every protocol scores query features from one model against gallery features from another model
*of the same images* (REFERENCE.md "Retrieval metrics"), so a whole compatibility-matrix row can
be computed from stored features without loading any model:

- ``identification``: 1:N top-1 (CMC), query set = gallery set, the query itself excluded by
  index (FCT, NI-FCL, the MNIST demo);
- ``verification``: 1:1 pairs with 10-fold threshold selection (CoReS, LFW-style); the pairs come
  from the dataset (LFW pairs.txt) or are drawn, seeded, from the labels;
- ``templates``: IAM-CL2R "1:N search": per-class mean templates of one half of the images
  (the gallery), queries from the other half.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raycompat.metrics.compatibility import CompatibilityMatrix
from raycompat.metrics.retrieval import cmc, template_identification
from raycompat.metrics.verification import make_pairs, verification_accuracy
from raycompat.registry import Registry

__all__ = ["PROTOCOLS", "EvalSet", "grow_matrix", "matrix_row", "score", "verification_eval_set"]

PROTOCOLS: Registry = Registry("evaluation protocol")


@dataclass
class EvalSet:
    """The images a protocol scores: their labels, and verification pairs if any.

    Attributes:
        labels: ``(N,)`` int64 identity labels.
        pairs: ``(P, 3)`` rows ``(i, j, same)`` for verification, or None.
        folds: ``(P,)`` explicit fold ids for the pairs (LFW), or None (seeded folds).
    """

    labels: np.ndarray
    pairs: np.ndarray | None = None
    folds: np.ndarray | None = None


@PROTOCOLS.register("identification")
def identification(query, gallery, eval_set: EvalSet, distance: str = "cosine") -> float:
    """1:N top-1 with the query excluded from the gallery by index."""
    labels = eval_set.labels
    return cmc(query, gallery, labels, labels, topk=(1,), distance=distance, exclude_self=True)[1]


@PROTOCOLS.register("verification")
def verification(query, gallery, eval_set: EvalSet, distance: str = "cosine") -> float:
    """10-fold 1:1 verification accuracy on L2-normalised features (squared L2 distance)."""
    if eval_set.pairs is None:
        raise ValueError("the verification protocol needs pairs (see verification_eval_set)")
    return verification_accuracy(query, gallery, eval_set.pairs, folds=eval_set.folds)


@PROTOCOLS.register("templates")
def templates(query, gallery, eval_set: EvalSet, distance: str = "cosine") -> float:
    """IAM-CL2R 1:N: even rows are queries, odd rows build per-class templates."""
    labels = np.asarray(eval_set.labels)
    rows = np.arange(len(labels))
    q, g = rows % 2 == 0, rows % 2 == 1
    return template_identification(query[q], labels[q], gallery[g], labels[g], topk=(1,))[1]


def verification_eval_set(labels: np.ndarray, num_pairs: int, seed: int) -> EvalSet:
    """Seeded ``num_pairs`` positive + ``num_pairs`` negative pairs over ``labels``."""
    return EvalSet(labels=labels, pairs=make_pairs(labels, num_pairs, num_pairs, seed=seed))


def score(protocol: str, query, gallery, eval_set: EvalSet, distance: str = "cosine") -> float:
    """``M(query model, gallery model)`` under ``protocol``; features ``(N, d_q)``, ``(N, d_g)``.

    Features of different widths (a wider new model against an older one) are compared on the
    first ``min(d_q, d_g)`` coordinates, i.e. the narrower one is zero-padded (BCT sec. 3.2).
    """
    query, gallery = torch.as_tensor(query), torch.as_tensor(gallery)
    if query.shape[0] != gallery.shape[0]:
        raise ValueError(
            f"query and gallery features must describe the same images: {query.shape[0]} vs "
            f"{gallery.shape[0]} rows"
        )
    width = min(query.shape[1], gallery.shape[1])
    fn = PROTOCOLS.get(protocol)
    return float(fn(query[:, :width], gallery[:, :width], eval_set, distance))


def matrix_row(
    protocol: str, new_features, previous_features: list, eval_set: EvalSet, distance: str
) -> list[float]:
    """``[M(t, 1), ..., M(t, t-1), M(t, t)]`` for the new model t against every earlier model."""
    row = [score(protocol, new_features, old, eval_set, distance) for old in previous_features]
    return row + [score(protocol, new_features, new_features, eval_set, distance)]


def selection_score(
    self_test: float, cross_test: float | None, old_self_test: float | None, strict: bool = True
) -> tuple[float, bool]:
    """CoReS model selection (eq. 10-12): best self-test among epochs that satisfy ECC.

    Returns ``(score, ecc)``: ``score = self_test + 1`` when the epoch satisfies ECC against the
    previous model (or there is none), else ``self_test``; with ``self_test`` in [0, 1], any
    compatible epoch outranks every incompatible one, and ties break on self-test.
    """
    if cross_test is None or old_self_test is None:
        return self_test + 1.0, True
    ecc = cross_test > old_self_test if strict else cross_test >= old_self_test
    return self_test + (1.0 if ecc else 0.0), bool(ecc)


def grow_matrix(
    matrix: CompatibilityMatrix | None, row: list[float], name: str, metric: str
) -> CompatibilityMatrix:
    matrix = matrix or CompatibilityMatrix(metric=metric, higher_is_better=True)
    matrix.add_row(row, name=name)
    return matrix
