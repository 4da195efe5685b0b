"""What each method serves on an evaluation set (``benchmarks/fidelity.py``), by registered
compatibility mode:

- ``direct``: model t searches model k's gallery as stored (BCT, CoReS, HOC, NI-FCL, baselines);
- ``fct``, ``fct_side``: model k's gallery is moved forward one version at a time,
  ``normalize(h_j(row[, psi]))`` for j = k+1..t (FCT sec. 3.3 and its sequences), with ``h``
  fitted by MSE without / with side-information psi;
- ``fastfill``: the same with FastFill's ``h`` (uncertainty head, uncertainty-weighted loss),
  plus the partial-backfill measures of each upgrade.

``h_t`` is fitted on model t's training images (FCT sec. 3.3): old side = model t-1's features
L2-normalised (the stored rows), target = model t's raw features.
"""

from __future__ import annotations

import numpy as np
import torch
from _fidelity_eval import Served, backfill_metrics, spearman, transformation_error
from _fidelity_train import (
    TrainData,
    apply_h,
    features,
    fit_fastfill,
    fit_h,
    normalized,
    train_side_info,
)

from raycompat.registry import Registry

COMPAT: Registry = Registry("compatibility mode")


class Transformations:
    """The fitted ``h_1 .. h_{T-1}`` of one model sequence, per variant, fitted on first use."""

    def __init__(self, models: list, data: TrainData, spec, seed: int) -> None:
        self.models, self.data, self.spec, self.seed = models, data, spec, seed
        self._fitted: dict[tuple[str, int], object] = {}
        self._psi = None
        self._rows: dict[int, tuple] = {}

    def psi(self):
        if self._psi is None:
            first = self.data.images[self.data.step_rows(0)]
            self._psi = train_side_info(first, self.data, self.spec, self.seed)
        return self._psi

    def training_rows(self, t: int) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
        """``(normalize(phi_{t-1}(X_t)), phi_t(X_t), X_t)`` over model t's training images."""
        if t not in self._rows:
            images = self.data.images[self.data.step_rows(t)]
            old = normalized(features(self.models[t - 1], images))
            self._rows[t] = (old, features(self.models[t], images), images)
        return self._rows[t]

    def fit(self, variant: str, t: int):
        key = (variant, t)
        if key not in self._fitted:
            old, new, images = self.training_rows(t)
            seed = self.seed * 1000 + t
            if variant == "fastfill":
                labels = self.data.labels[self.data.step_rows(t)].numpy()
                h = fit_fastfill(old, new, labels, self.models[t].head, self.spec, seed)
            else:
                side = features(self.psi(), images) if variant == "side" else None
                h = fit_h(old, new, side, self.spec, seed)
            self._fitted[key] = h
        return self._fitted[key]


def _forward(transform, queries: list[np.ndarray]) -> dict[tuple[int, int], np.ndarray]:
    """``galleries[t, k]``: model k's normalised rows moved forward by ``transform(j, rows)``
    for j = k+1..t."""
    galleries = {}
    for k in range(len(queries)):
        rows = normalized(queries[k])
        galleries[k, k] = queries[k]
        for t in range(k + 1, len(queries)):
            rows = transform(t, rows)
            galleries[t, k] = rows
    return galleries


@COMPAT.register("direct")
def direct(queries, images, labels, fits: Transformations | None) -> tuple[Served, dict]:
    galleries = {(t, k): queries[k] for t in range(len(queries)) for k in range(t + 1)}
    return Served(queries, galleries, labels), {}


def _fct(variant: str):
    def serve(queries, images, labels, fits: Transformations) -> tuple[Served, dict]:
        side = features(fits.psi(), images) if variant == "side" else None
        galleries = _forward(lambda t, rows: apply_h(fits.fit(variant, t), rows, side), queries)
        return Served(queries, galleries, labels), {}

    return serve


COMPAT.register("fct")(_fct("plain"))
COMPAT.register("fct_side")(_fct("side"))


@COMPAT.register("fastfill")
def fastfill(queries, images, labels, fits: Transformations) -> tuple[Served, dict]:
    """FastFill's ``h`` serves the gallery; per upgrade t (model t replacing t-1): backfill AUCs
    and Spearman's rho of uncertainty vs true error on this gallery and on h's training rows."""

    def transform(t, rows):
        return normalized(fits.fit("fastfill", t).transform(rows)[0])

    served = Served(queries, _forward(transform, queries), labels)
    upgrades = []
    for t in range(1, len(queries)):
        h = fits.fit("fastfill", t)
        moved, uncertainty = h.transform(normalized(queries[t - 1]))
        measures = backfill_metrics(queries[t], moved, uncertainty, labels, fits.spec.random_orders)
        old, new, _ = fits.training_rows(t)
        fit_moved, fit_uncertainty = h.transform(old)
        measures["spearman_fit_rows"] = spearman(
            fit_uncertainty, transformation_error(fit_moved, new)
        )
        upgrades.append(measures)
    return served, {"backfill": upgrades}
