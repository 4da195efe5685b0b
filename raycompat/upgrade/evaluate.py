"""Score a new model against every registered model on the shared test images (no Ray).

The compatibility matrix of an upgrade history has one row per registered model version, in
registration order, plus the candidate: ``M(t, k)`` queries with model t's features against a
gallery of model k's features *of the same test images* (REFERENCE.md protocols, via
:mod:`raycompat.evaluation`). For an FCT upgrade the candidate's cross-test is also scored
against ``h(phi_old)``, the gallery as it would be after the transformation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from raycompat.config.train import TrainConfig
from raycompat.evaluation import EvalSet, grow_matrix, score
from raycompat.metrics.compatibility import CompatibilityMatrix, ecc, update_gain
from raycompat.train.data import load_images, make_splits, open_dataset, test_source


@dataclass
class EvalData:
    """The test images every model of a history is scored on, and how."""

    dataset: object
    rows: np.ndarray
    eval_set: EvalSet
    protocol: str
    distance: str
    strict: bool
    batch_size: int
    labels_are_classes: bool = False  # test labels are the training classes (held-out split)

    def score(self, query: np.ndarray, gallery: np.ndarray) -> float:
        return score(self.protocol, query, gallery, self.eval_set, self.distance)

    def classes_below(self, classes: int) -> np.ndarray | None:
        """Mask of the test images of training classes ``[0, classes)``, when that subset is
        meaningful: identification on the held-out split, a proper non-empty subset."""
        if self.protocol != "identification" or not self.labels_are_classes:
            return None
        mask = np.asarray(self.eval_set.labels) < classes
        return mask if 1 < mask.sum() < len(mask) else None


def eval_data(cfg: TrainConfig) -> EvalData:
    """The test split (or ``eval.dataset``) of the shared training config, as the driver sees
    it: the same seeded split, so features stored in training checkpoints line up."""
    dataset = open_dataset(cfg.data)
    splits = make_splits(cfg, dataset.labels)
    source, rows, eval_set = test_source(cfg, dataset, dataset.labels, splits)
    return EvalData(
        source,
        rows,
        eval_set,
        cfg.eval.protocol,
        cfg.eval.distance,
        cfg.eval.strict_ecc,
        cfg.eval.batch_size,
        labels_are_classes=cfg.eval.dataset is None and cfg.eval.split == "closed_set",
    )


@torch.no_grad()
def model_features(model, data: EvalData) -> np.ndarray:
    """``(N, d)`` features of the test images, in ``data.rows`` order."""
    model.eval()
    parts = [
        model.forward_features(
            load_images(data.dataset, data.rows[i : i + data.batch_size], "none", None)
        ).float()
        for i in range(0, len(data.rows), data.batch_size)
    ]
    return torch.cat(parts).numpy()


def history_matrix(names: list[str], features: dict[str, np.ndarray], data: EvalData):
    """Lower-triangular ``M(t, k)``, ``k <= t``, over ``names`` in order."""
    matrix: CompatibilityMatrix | None = None
    for t, name in enumerate(names):
        row = [data.score(features[name], features[k]) for k in names[: t + 1]]
        matrix = grow_matrix(matrix, row, name, data.protocol)
    return matrix


@dataclass
class Evidence:
    """What the decision rests on, for the candidate against the gallery's model.

    ``cross``: M(new, gallery) - queries of the new model against the stored gallery (for FCT:
    against h(gallery)); ``old_self``: M(gallery, gallery); ``new_self``: M(new, new).
    ``ecc``: the empirical compatibility criterion, cross > old_self (>= unless strict);
    ``update_gain``: (cross - old_self) / (new_self - old_self), None when undefined.
    """

    against: str
    cross: float
    old_self: float
    new_self: float
    ecc: bool
    update_gain: float | None
    transformed: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def evidence(
    data: EvalData,
    new: np.ndarray,
    gallery: np.ndarray,
    old_self: float,
    against: str,
    transformed: bool = False,
) -> Evidence:
    cross, new_self = data.score(new, gallery), data.score(new, new)
    try:
        gain = update_gain(cross, old_self, new_self)
    except ValueError:
        gain = None
    return Evidence(
        against, cross, old_self, new_self, ecc(cross, old_self, data.strict), gain, transformed
    )


def evidence_on_classes(
    data: EvalData,
    classes: int,
    new: np.ndarray,
    gallery: np.ndarray,
    old: np.ndarray,
    against: str,
) -> Evidence | None:
    """The same evidence on the test images of the classes the gallery model was trained on
    (reported beside the decision, which uses every test image): it separates a method that
    keeps the old model's classes compatible from the effect of the classes it never saw."""
    mask = data.classes_below(classes)
    if mask is None:
        return None
    sub = dataclasses.replace(
        data, rows=data.rows[mask], eval_set=EvalSet(np.asarray(data.eval_set.labels)[mask])
    )
    return evidence(sub, new[mask], gallery[mask], sub.score(old[mask], gallery[mask]), against)
