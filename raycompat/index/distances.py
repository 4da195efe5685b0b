"""Distances between query and gallery embeddings, as "higher is better" scores.

The papers disagree on the distance (REFERENCE.md, "Retrieval metrics"): d-Simplex-HOC and CoReS
compare L2-normalised features by inner product (cosine), FCT uses the squared L2 distance on raw
features. The distance is therefore an explicit, registered option:

- ``"cosine"``: L2-normalise, then inner product. Score in [-1, 1].
- ``"l2"``: raw features, score ``-||q - g||^2`` (so that higher is still better).
- ``"inner_product"``: raw features, score ``q . g``.

Every distance object has ``prepare(x)`` (what to apply to features before indexing or scoring),
``scores(q, g)`` (``(Q, d), (G, d) -> (Q, G)``, higher is better) and ``faiss_metric``.

torch is imported by the functions that compute with it, not by this module: the CLI and the
faiss search path use the registry and :class:`ZeroNormError` without loading torch (~1 s).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raycompat.errors import DataError
from raycompat.registry import Registry

if TYPE_CHECKING:
    import torch


def as_features(x: Any, name: str = "features") -> torch.Tensor:
    """Validate and convert an embedding matrix to a floating-point tensor (no copy if possible).

    Args:
        x: ``(N, d)`` numpy array or tensor; float64 stays float64, other dtypes become float32.
        name: what to call ``x`` in error messages (``"query"``, ``"gallery"``).
    Returns:
        ``(N, d)`` tensor on ``x``'s device.
    Raises:
        ValueError: not 2-D, empty, or a non-finite value (the first bad row is named).
    """
    import torch

    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (N, d) matrix, got shape {tuple(t.shape)}")
    if t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(t.shape)}")
    if t.dtype != torch.float64:
        t = t.float()
    bad = ~torch.isfinite(t).all(dim=1)
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise ValueError(
            f"{name} has {int(bad.sum())} row(s) with NaN/inf values; first is row {row}"
        )
    return t


def as_features_numpy(x: Any, name: str = "features") -> np.ndarray:
    """:func:`as_features` in NumPy, for the faiss search path (no torch): an ``(N, d)``
    float32 array (float64 stays float64), with the same checks and messages. A torch tensor is
    accepted (its caller has loaded torch) and copied to the host."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (N, d) matrix, got shape {tuple(a.shape)}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(a.shape)}")
    if a.dtype != np.float64:
        a = a.astype(np.float32, copy=False)
    if not np.isfinite(a).all():  # the rows only once some are at fault
        bad = ~np.isfinite(a).all(axis=1)
        raise ValueError(
            f"{name} has {int(bad.sum())} row(s) with NaN/inf values; first is row "
            f"{int(np.argmax(bad))}"
        )
    return a


# torch.nn.functional.normalize's eps: below it a row has no direction to compare.
ZERO_NORM = 1e-12


class ZeroNormError(DataError, ValueError):
    """Rows with (near) zero norm were given to a cosine search; ``rows`` lists them."""

    def __init__(self, message: str, rows: list[int]):
        super().__init__(message)
        self.rows = rows

    def __reduce__(self):
        # Unpickling (Ray's, handing the error from a task or an actor to its caller) calls the
        # class with ``args``, which lack ``rows``; the state keeps any note added to the error.
        return type(self), (self.args[0], self.rows), vars(self)


def check_nonzero_rows(t: torch.Tensor, name: str = "features") -> None:
    """Raise :class:`ZeroNormError` naming the rows of ``t (N, d)`` whose L2 norm is < 1e-12.

    Cosine similarity is undefined for them; normalising leaves them zero, which scores 0 against
    every item and returns an arbitrary top-k instead of an error.
    """
    import torch

    zero = torch.linalg.vector_norm(t, dim=1) < ZERO_NORM
    if bool(zero.any()):
        raise zero_norm_error(torch.nonzero(zero)[:, 0].tolist(), name)


def zero_norm_error(rows: list[int], name: str) -> ZeroNormError:
    """The error naming ``rows`` of ``name`` as zero vectors (at most 10 shown)."""
    shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
    return ZeroNormError(
        f"{name} has {len(rows)} row(s) with zero norm (< {ZERO_NORM:g}), cosine similarity "
        f"is undefined for them: row(s) {shown}",
        rows,
    )


def check_same_width(query: torch.Tensor, gallery: torch.Tensor) -> None:
    if query.shape[1] != gallery.shape[1]:
        raise ValueError(
            f"query width {query.shape[1]} != gallery width {gallery.shape[1]}: features from "
            f"models with different dimensions cannot be compared directly"
        )


@dataclass(frozen=True)
class Distance:
    """A distance turned into a similarity score (higher is better).

    Attributes:
        name: registry name.
        normalize: whether ``prepare`` L2-normalises rows (cosine).
        squared_l2: score is ``-||q - g||^2`` instead of ``q . g``.
        score_range: the scores the distance can give: ``[-1, 1]`` for cosine, ``<= 0`` for
            ``l2``. A quantized index (IVF-PQ) approximates them and may step outside it
            (a cosine of 1.0004); :meth:`from_faiss` clips its answers back in.
        score_label: what a score is, in words, as every search answer labels it.
    """

    name: str
    normalize: bool
    squared_l2: bool
    score_range: tuple[float, float] = (-np.inf, np.inf)
    score_label: str = "inner product"

    @property
    def faiss_metric(self) -> int:
        """``faiss.METRIC_L2`` for ``"l2"``, ``faiss.METRIC_INNER_PRODUCT`` otherwise."""
        import faiss

        return faiss.METRIC_L2 if self.squared_l2 else faiss.METRIC_INNER_PRODUCT

    def prepare(self, x: Any, name: str = "features", *, refuse_zero: bool = False) -> torch.Tensor:
        """Validate ``(N, d)`` features and L2-normalise rows for cosine.

        A zero row stays zero, unless ``refuse_zero`` (queries): then a normalising distance
        raises :class:`ZeroNormError` naming the rows. Other distances accept zero rows.
        """
        import torch

        t = as_features(x, name)
        if not self.normalize:
            return t
        if refuse_zero:
            check_nonzero_rows(t, name)
        return torch.nn.functional.normalize(t, dim=1)

    def prepare_numpy(self, x: Any, name: str = "features", *, refuse_zero: bool = False):
        """:meth:`prepare` in NumPy (the faiss search path, no torch): ``(N, d)`` float32 or
        float64 array, rows divided by their L2 norm for cosine, same errors."""
        a = as_features_numpy(x, name)
        if not self.normalize:
            return a
        norms = np.sqrt(np.vecdot(a, a))  # one pass, no temporary (N, d); lighter than einsum
        if refuse_zero:
            if norms.min() < ZERO_NORM:
                raise zero_norm_error(np.flatnonzero(norms < ZERO_NORM).tolist(), name)
            return a / norms[:, None]  # every norm is at least eps: as below
        return a / np.maximum(norms, ZERO_NORM)[:, None]  # torch's normalize: x / max(|x|, eps)

    def scores(self, query: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
        """Scores of already prepared features: ``(Q, d), (G, d) -> (Q, G)``, higher is better."""
        check_same_width(query, gallery)
        dots = query @ gallery.T
        if not self.squared_l2:
            return dots
        sq = (query * query).sum(1, keepdim=True) + (gallery * gallery).sum(1) - 2.0 * dots
        return -sq.clamp_min(0.0)

    def from_faiss(self, raw: np.ndarray) -> np.ndarray:
        """Turn faiss' output (squared L2 for METRIC_L2, inner product otherwise) into scores,
        clipped to :attr:`score_range` (faiss's padding, ``-inf``, becomes its low end: the
        caller marks padded rows itself). ``maximum`` then ``minimum``, as ``np.clip`` does,
        without its dispatch (5 us of a 300 us single-query search)."""
        low, high = self.score_range
        return np.minimum(np.maximum(-raw if self.squared_l2 else raw, low), high)


DISTANCES: Registry[Distance] = Registry("distance")


@DISTANCES.register("cosine")
def cosine() -> Distance:
    return Distance(
        "cosine", normalize=True, squared_l2=False, score_range=(-1.0, 1.0),
        score_label="cosine similarity",
    )  # fmt: skip


@DISTANCES.register("l2")
def l2() -> Distance:
    return Distance(
        "l2", normalize=False, squared_l2=True, score_range=(-np.inf, 0.0),
        score_label="negative squared L2",
    )  # fmt: skip


@DISTANCES.register("inner_product")
def inner_product() -> Distance:
    return Distance("inner_product", normalize=False, squared_l2=False)


def get_distance(distance: str | Distance) -> Distance:
    """Look up a registered distance by name (a :class:`Distance` passes through)."""
    return distance if isinstance(distance, Distance) else DISTANCES.create(distance)
