"""Upgrades without retraining in ``benchmarks/fidelity.py`` (issue 41, item 5): the models
trained ``independent``-ly (an off-the-shelf pair: nothing ties their spaces), each later one
mapped onto an earlier one by a map fitted on paired rows (``raycompat.transformations``:
``procrustes``, ``affine``, ``adapter``, ``slerp``), in two directions:

- ``query``: model t's queries are mapped into model k's space; model k's gallery is served as
  stored (nothing is rewritten). ``hop``: through the maps of each upgrade, t -> t-1 -> .. -> k;
  ``direct``: one map fitted from t to k.
- ``gallery``: model k's stored rows are moved forward, one upgrade at a time, as FCT's h moves
  them (``direct``: one map from k to t).

A map of upgrade j (model j replacing j-1) is fitted on model j's training images embedded by
both models, as FCT's h is (FCT sec. 3.3). Gallery maps, as h: the stored (older) side
L2-normalised, the newer raw. Query maps: both sides L2-normalised, and the queries normalised
before each hop (scores are cosine, so this changes no single-model ranking, and each hop sees
the inputs it was fitted on). A
budget keeps that many pairs, a seeded sample; the linear fits need at least as many pairs as
the widths, so a budget below the width is raised to it (the report says so). Nothing is
tuned: ``lam`` 0 for ``affine``, the adapter's defaults.
"""

from __future__ import annotations

import numpy as np
from _fidelity_eval import Served
from _fidelity_train import apply_h, features, normalized

from raycompat.transformations import fit_kind

KINDS = ("procrustes", "affine", "adapter", "slerp")
BUDGETS = (100, 1000)  # the curve; the plain entries use every training image
# entry -> (training method, serving mode "map/<kind>/<direction>/<chain>/<budget>")
MAP_ENTRIES = {
    **{
        f"{kind}_{side}": ("independent", f"map/{kind}/{side}/hop/all")
        for side in ("query", "gallery")
        for kind in KINDS
    },
    **{f"{kind}_query_direct": ("independent", f"map/{kind}/query/direct/all") for kind in KINDS},
    **{f"procrustes_query@{n}": ("independent", f"map/procrustes/query/hop/{n}") for n in BUDGETS},
}


class Maps:
    """The maps of one model sequence, fitted on first use and shared by every entry and
    evaluation set (``fits``: its FCT ``Transformations``, for the models, the training data and
    the seed; :func:`maps_of`)."""

    def __init__(self, fits) -> None:
        self.models, self.data, self.seed = fits.models, fits.data, fits.seed
        self._maps: dict[tuple, object] = {}
        self._features: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.pairs_used: dict[tuple, int] = {}

    def pairs(self, source: int, target: int, budget: str) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)``: model ``source``'s and model ``target``'s features of the newer model's
        training images (module docstring: which side is normalised)."""
        if (source, target) not in self._features:  # every kind and budget fits on these
            images = self.data.images[self.data.step_rows(max(source, target))]
            x, y = features(self.models[source], images), features(self.models[target], images)
            self._features[source, target] = (
                normalized(x),
                normalized(y) if source > target else y,
            )
        x, y = self._features[source, target]
        if budget != "all":
            need = max(int(budget), x.shape[1] + 1, y.shape[1] + 1)
            rng = np.random.default_rng(self.seed * 1000 + 10 * source + target)
            keep = np.sort(rng.choice(len(x), size=min(need, len(x)), replace=False))
            x, y = x[keep], y[keep]
        return x, y

    def fit(self, kind: str, source: int, target: int, budget: str, used: list | None = None):
        """The map from model ``source`` to model ``target``; ``used`` gets its pairs."""
        key = (kind, source, target, budget)
        if key not in self._maps:
            x, y = self.pairs(source, target, budget)
            seed = self.seed * 1000 + 10 * source + target
            self._maps[key] = fit_kind(kind, x, y, seed=seed, where="fidelity pairs").transformation
            self.pairs_used[key] = len(x)
        if used is not None:
            used.append(self.pairs_used[key])
        return self._maps[key]


def maps_of(fits) -> Maps:
    if getattr(fits, "maps", None) is None:
        fits.maps = Maps(fits)
    return fits.maps


def serve_map(kind: str, side: str, chain: str, budget: str):
    """The serving mode of one entry: ``(queries, images, labels, fits) -> (Served, extra)``."""

    def serve(queries, images, labels, fits) -> tuple[Served, dict]:
        maps, used = maps_of(fits), []
        T = len(queries)
        galleries = {(t, t): queries[t] for t in range(T)}
        query_maps = {}
        for k in range(T):
            for t in range(k + 1, T):
                if side == "query":
                    galleries[t, k] = queries[k]
                    query_maps[t, k] = _query(maps, used, kind, chain, budget, queries[t], t, k)
                else:
                    galleries[t, k] = _gallery(maps, used, kind, chain, budget, queries[k], t, k)
        extra = {"pairs_min": min(used), "pairs_max": max(used)}
        return Served(queries, galleries, labels, query_maps), extra

    return serve


def _query(maps: Maps, used, kind, chain, budget, rows, t: int, k: int) -> np.ndarray:
    hops = [(t, k)] if chain == "direct" else [(j, j - 1) for j in range(t, k, -1)]
    for source, target in hops:  # t -> t-1 -> .. -> k: each hop's map on its own pairs
        rows = apply_h(maps.fit(kind, source, target, budget, used), normalized(rows), None)
    return rows  # unit rows: the cosine scores are those of the mapped queries


def _gallery(maps: Maps, used, kind, chain, budget, rows, t: int, k: int) -> np.ndarray:
    rows = normalized(rows)  # the stored rows
    hops = [(k, t)] if chain == "direct" else [(j - 1, j) for j in range(k + 1, t + 1)]
    for source, target in hops:
        rows = apply_h(maps.fit(kind, source, target, budget, used), rows, None)
    return rows


def register(compat) -> None:
    """Add every map entry's serving mode to the ``COMPAT`` registry."""
    for _, mode in MAP_ENTRIES.values():
        if mode not in compat.names():  # imported twice (a spawned seed process)
            _, kind, side, chain, budget = mode.split("/")
            compat.register(mode)(serve_map(kind, side, chain, budget))
