"""1:N retrieval metrics: CMC / top-k identification, mAP, mAP@R, template identification.

REFERENCE.md "Retrieval metrics". Queries are processed in chunks of ``chunk x G`` scores, so the
full ``Q x G`` matrix is never built; inside a chunk everything is vectorised.

Conventions, shared by all functions here:

- ``distance`` is a name in :data:`raycompat.index.distances.DISTANCES` (HOC: ``"cosine"``, FCT:
  ``"l2"`` on raw features).
- ``exclude_self=True`` says that query ``i`` IS gallery item ``i`` (same images, possibly
  embedded by different models); item ``i`` is removed from query ``i``'s ranking by index.
- Ties are pessimistic: a non-matching gallery item whose score equals a matching one is ranked
  before it. Degenerate features (e.g. all equal) then score 0, never 1.
- Queries with no matching gallery item are left out of every average (as in the Market-1501
  protocol) and a warning is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from raycompat.index.distances import Distance, check_same_width, get_distance

logger = logging.getLogger(__name__)

_CHUNK_ELEMENTS = 1 << 21  # scores per chunk; sorting needs ~40 bytes per score


def _labels(labels: Any, n: int, name: str) -> np.ndarray:
    arr = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {arr.shape}")
    return arr


def _ks(topk: Sequence[int]) -> list[int]:
    ks = sorted({int(k) for k in topk})
    if not ks or ks[0] < 1:
        raise ValueError(f"topk must be positive integers, got {tuple(topk)}")
    return ks


def _setup(
    query: Any,
    gallery: Any,
    query_labels: Any,
    gallery_labels: Any,
    distance: str | Distance,
    exclude_self: bool,
):
    dist = get_distance(distance)
    q, g = dist.prepare(query, "query"), dist.prepare(gallery, "gallery")
    check_same_width(q, g)
    ql = _labels(query_labels, q.shape[0], "query_labels")
    gl = _labels(gallery_labels, g.shape[0], "gallery_labels")
    if exclude_self:
        if q.shape[0] != g.shape[0]:
            raise ValueError(
                f"exclude_self=True needs query i == gallery item i, but there are "
                f"{q.shape[0]} queries and {g.shape[0]} gallery items"
            )
        differ = np.nonzero(ql != gl)[0]
        if differ.size:
            raise ValueError(
                f"exclude_self=True but query and gallery labels differ at row "
                f"{differ[0]}: they cannot be the same items"
            )
    codes = np.unique(np.concatenate([ql, gl]), return_inverse=True)[1].reshape(-1)
    codes = torch.as_tensor(codes, device=q.device)
    return dist, q, g, codes[: q.shape[0]], codes[q.shape[0] :]


def _chunks(
    dist: Distance,
    q: torch.Tensor,
    g: torch.Tensor,
    ql: torch.Tensor,
    gl: torch.Tensor,
    exclude_self: bool,
    chunk_size: int | None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``scores (c, G)`` and ``relevant (c, G)`` per chunk; self entries get -inf, False."""
    step = chunk_size or max(1, _CHUNK_ELEMENTS // g.shape[0])
    for s in range(0, q.shape[0], step):
        scores = dist.scores(q[s : s + step], g)
        relevant = ql[s : s + step, None] == gl[None, :]
        if exclude_self:
            rows = torch.arange(scores.shape[0], device=scores.device)
            scores[rows, rows + s] = -torch.inf
            relevant[rows, rows + s] = False
        yield scores, relevant


def _mean_over_valid(values: torch.Tensor, valid: torch.Tensor, what: str) -> float:
    if not bool(valid.any()):
        raise ValueError(f"{what}: no query has a matching gallery item")
    if not bool(valid.all()):
        logger.warning(
            "%s: %d of %d queries have no matching gallery item and are skipped",
            what,
            int((~valid).sum()),
            valid.numel(),
        )
    return float(values[valid].double().mean())


def cmc(
    query: Any,
    gallery: Any,
    query_labels: Any,
    gallery_labels: Any,
    topk: Sequence[int] = (1, 5, 10),
    distance: str | Distance = "cosine",
    exclude_self: bool = False,
    chunk_size: int | None = None,
) -> dict[int, float]:
    """Cumulative match characteristic: fraction of queries with a match in the top k.

    Args:
        query, gallery: ``(Q, d)``, ``(G, d)`` features; labels ``(Q,)``, ``(G,)``.
    Returns:
        ``{k: accuracy}`` for every k in ``topk`` (top-1 is FCT's / NI-FCL's identification
        accuracy). Rank of a query = 1 + #{non-matching items scoring >= its best match}.
    """
    ks = _ks(topk)
    rank, ok = _match_ranks(
        query, gallery, query_labels, gallery_labels, distance, exclude_self, chunk_size
    )
    return {k: _mean_over_valid((rank <= k).float(), ok, f"top-{k}") for k in ks}


def _match_ranks(
    query, gallery, query_labels, gallery_labels, distance, exclude_self, chunk_size
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rank (Q,), valid (Q,))``: each query's rank of its best match (pessimistic ties) and
    whether it has a match at all."""
    dist, q, g, ql, gl = _setup(
        query, gallery, query_labels, gallery_labels, distance, exclude_self
    )
    ranks, valid = [], []
    for scores, relevant in _chunks(dist, q, g, ql, gl, exclude_self, chunk_size):
        best = torch.where(relevant, scores, -torch.inf).amax(dim=1, keepdim=True)
        ranks.append(((scores >= best) & ~relevant).sum(dim=1) + 1)
        valid.append(relevant.any(dim=1))
    return torch.cat(ranks), torch.cat(valid)


def top1_hits(
    query: Any,
    gallery: Any,
    query_labels: Any,
    gallery_labels: Any,
    distance: str | Distance = "cosine",
    exclude_self: bool = False,
    chunk_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per query: is its nearest gallery item a match? What :func:`cmc`'s top-1 averages.

    Returns:
        ``(hit (Q,) bool, valid (Q,) bool)``; ``valid`` is False for a query with no matching
        gallery item (left out of every average).
    """
    rank, ok = _match_ranks(
        query, gallery, query_labels, gallery_labels, distance, exclude_self, chunk_size
    )
    return (rank == 1).cpu().numpy(), ok.cpu().numpy()


def _average_precisions(
    query, gallery, query_labels, gallery_labels, distance, exclude_self, chunk_size, at_r: bool
) -> float:
    dist, q, g, ql, gl = _setup(
        query, gallery, query_labels, gallery_labels, distance, exclude_self
    )
    positions = torch.arange(1, g.shape[0] + 1, device=q.device, dtype=torch.float64)
    aps, valid = [], []
    for scores, relevant in _chunks(dist, q, g, ql, gl, exclude_self, chunk_size):
        # Stable sort by score of columns pre-ordered non-matching first = pessimistic ties.
        pre = torch.argsort(relevant.to(torch.int8), dim=1, stable=True)
        order = torch.sort(scores.gather(1, pre), dim=1, descending=True, stable=True).indices
        hits = relevant.gather(1, pre).gather(1, order).double()
        n_rel = hits.sum(dim=1)
        precision_at_hits = hits.cumsum(dim=1) / positions * hits
        if at_r:
            precision_at_hits = precision_at_hits * (positions[None, :] <= n_rel[:, None])
        aps.append(precision_at_hits.sum(dim=1) / n_rel.clamp_min(1))
        valid.append(n_rel > 0)
    return _mean_over_valid(torch.cat(aps), torch.cat(valid), "mAP@R" if at_r else "mAP")


def mean_average_precision(
    query: Any,
    gallery: Any,
    query_labels: Any,
    gallery_labels: Any,
    distance: str | Distance = "cosine",
    exclude_self: bool = False,
    chunk_size: int | None = None,
) -> float:
    """FCT's "mAP@1.0": mean over queries of AP over the FULL gallery ranking.

    AP = (1/R) sum over matching items of precision at their rank, R = #matching items.
    """
    return _average_precisions(
        query, gallery, query_labels, gallery_labels, distance, exclude_self, chunk_size, at_r=False
    )


def map_at_r(
    query: Any,
    gallery: Any,
    query_labels: Any,
    gallery_labels: Any,
    distance: str | Distance = "cosine",
    exclude_self: bool = False,
    chunk_size: int | None = None,
) -> float:
    """mAP@R (Musgrave et al. 2020): ``(1/R) sum_{i<=R} P(i) rel(i)``, R = #matching items."""
    return _average_precisions(
        query, gallery, query_labels, gallery_labels, distance, exclude_self, chunk_size, at_r=True
    )


def template_identification(
    query: Any,
    query_labels: Any,
    gallery: Any,
    gallery_labels: Any,
    topk: Sequence[int] = (1,),
    normalize_features: bool = True,
    chunk_size: int | None = None,
) -> dict[int, float]:
    """IAM-CL2R "1:N search": match queries against one template per gallery class.

    Template of class c = L2-normalised mean of the class's gallery features (each feature first
    L2-normalised when ``normalize_features``, as HOC features are); score = inner product.
    Every query counts; a query whose class has no template is a miss.

    Returns:
        ``{k: accuracy}``; rank = 1 + #{other templates scoring >= the query's own template}.
    """
    ks = _ks(topk)
    ip = get_distance("inner_product")
    feature_space = get_distance("cosine" if normalize_features else "inner_product")
    q, g = ip.prepare(query, "query"), feature_space.prepare(gallery, "gallery")
    ql = _labels(query_labels, q.shape[0], "query_labels")
    gl = _labels(gallery_labels, g.shape[0], "gallery_labels")
    classes, inverse = np.unique(gl, return_inverse=True)
    inverse = torch.as_tensor(inverse.reshape(-1), device=g.device)
    sums = torch.zeros(len(classes), g.shape[1], dtype=g.dtype, device=g.device)
    templates = torch.nn.functional.normalize(sums.index_add_(0, inverse, g), dim=1)
    # A query of a class without a template gets code -1, which matches no template: a miss.
    slot = np.searchsorted(classes, ql).clip(max=len(classes) - 1)
    q_codes = np.where(classes[slot] == ql, slot, -1)
    if (q_codes < 0).any():
        logger.warning(
            "template identification: %d queries have no gallery template", int((q_codes < 0).sum())
        )
    dist, q, t, qc, tc = _setup(q, templates, q_codes, np.arange(len(classes)), ip, False)
    ranks = []
    for scores, relevant in _chunks(dist, q, t, qc, tc, False, chunk_size):
        own = torch.where(relevant, scores, -torch.inf).amax(dim=1, keepdim=True)
        rank = (((scores >= own) & ~relevant).sum(dim=1) + 1).double()
        ranks.append(torch.where(relevant.any(dim=1), rank, torch.inf))
    rank = torch.cat(ranks)
    return {k: float((rank <= k).double().mean()) for k in ks}
