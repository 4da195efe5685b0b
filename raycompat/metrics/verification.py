"""1:1 verification accuracy with 10-fold threshold selection (CoReS, LFW protocol).

REFERENCE.md "Retrieval metrics": pairs ``(i, j, same)``; features L2-normalised; distance =
squared L2 (``2 - 2 cos``); for each fold the threshold that maximises accuracy on the other
folds is applied to it; the result is the mean of the fold accuracies. CIFAR-10 protocol: 3000
positive + 3000 negative seeded pairs (:func:`make_pairs`); LFW: pairs.txt's 10 folds of 300+300
(pass them as ``folds``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raycompat.index.distances import as_features, check_same_width

__all__ = ["make_pairs", "pair_distances", "best_threshold", "verification_accuracy"]

_PAIR_CHUNK = 65536


def _sample_unique(
    draw, enumerate_all, n: int, count: int, total: int, rng: np.random.Generator, what: str
) -> np.ndarray:
    """``count`` distinct unordered pairs (i < j): rejection sampling from ``draw(rng, size)``,
    or a choice among ``enumerate_all()`` when more than half of all ``total`` pairs are asked."""
    if count > total:
        raise ValueError(f"asked for {count} {what} pairs but only {total} exist")
    if 2 * count > total:
        i, j = enumerate_all()
        keys = (i * n + j)[rng.choice(total, size=count, replace=False)]
    else:
        keys = np.empty(0, dtype=np.int64)
    while keys.shape[0] < count:
        i, j = draw(rng, 2 * (count - keys.shape[0]) + 64)
        new = np.minimum(i, j) * n + np.maximum(i, j)
        new = new[np.sort(np.unique(new, return_index=True)[1])]  # dedupe, keep draw order
        keys = np.concatenate([keys, new[~np.isin(new, keys)]])[:count]
    return np.stack([keys // n, keys % n], axis=1)


def make_pairs(
    labels: Any, num_positive: int = 3000, num_negative: int = 3000, seed: int = 0
) -> np.ndarray:
    """Seeded verification pairs (CoReS CIFAR-10 protocol: 3000 + 3000).

    Pairs are drawn uniformly among all unordered pairs of distinct items, without duplicates.
    Args:
        labels: ``(N,)`` class labels.
    Returns:
        ``(P, 3)`` int64 rows ``(i, j, same)`` with ``i < j``; positives first, then negatives.
    """
    y = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    n = y.shape[0]
    _, codes, counts = np.unique(y, return_inverse=True, return_counts=True)
    by_class = np.argsort(codes.reshape(-1), kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    weights = counts * (counts - 1) / 2
    total_positive = int(weights.sum())

    def positives(rng, size):  # class with prob ~ #pairs in it, then two distinct members
        c = rng.choice(len(counts), size=size, p=weights / weights.sum())
        a = (rng.random(size) * counts[c]).astype(np.int64)
        b = (rng.random(size) * (counts[c] - 1)).astype(np.int64)
        b += b >= a
        return by_class[starts[c] + a], by_class[starts[c] + b]

    def negatives(rng, size):
        i, j = rng.integers(0, n, size=(2, size))
        keep = y[i] != y[j]
        return i[keep], j[keep]

    def all_positives():
        pairs = [np.triu_indices(k, 1) for k in counts]
        i = np.concatenate([by_class[o + a] for o, (a, _) in zip(starts, pairs, strict=True)])
        j = np.concatenate([by_class[o + b] for o, (_, b) in zip(starts, pairs, strict=True)])
        return np.minimum(i, j), np.maximum(i, j)

    def all_negatives():
        i, j = np.triu_indices(n, 1)
        keep = y[i] != y[j]
        return i[keep], j[keep]

    rng = np.random.default_rng(seed)
    pos = _sample_unique(positives, all_positives, n, num_positive, total_positive, rng, "positive")
    neg = _sample_unique(
        negatives,
        all_negatives,
        n,
        num_negative,
        n * (n - 1) // 2 - total_positive,
        rng,
        "negative",
    )
    same = np.concatenate([np.ones(num_positive), np.zeros(num_negative)]).astype(np.int64)
    return np.concatenate([np.concatenate([pos, neg]), same[:, None]], axis=1)


def pair_distances(query_features: Any, gallery_features: Any, pairs: Any) -> np.ndarray:
    """Squared L2 distance of L2-normalised ``query_features[i]`` and ``gallery_features[j]``.

    Args:
        query_features: ``(N, d)``; gallery_features: ``(M, d)`` (possibly another model).
        pairs: ``(P, 3)`` rows ``(i, j, same)``.
    Returns:
        ``(P,)`` float64 distances in [0, 4].
    """
    q = torch.nn.functional.normalize(as_features(query_features, "query_features").double(), dim=1)
    g = torch.nn.functional.normalize(
        as_features(gallery_features, "gallery_features").double(), dim=1
    )
    check_same_width(q, g)
    p = _check_pairs(pairs, q.shape[0], g.shape[0])
    out = np.empty(p.shape[0])
    for s in range(0, p.shape[0], _PAIR_CHUNK):
        i = torch.as_tensor(p[s : s + _PAIR_CHUNK, 0], device=q.device)
        j = torch.as_tensor(p[s : s + _PAIR_CHUNK, 1], device=g.device)
        out[s : s + _PAIR_CHUNK] = (q[i] - g[j]).pow(2).sum(dim=1).cpu().numpy()
    return out


def _check_pairs(pairs: Any, n_query: int, n_gallery: int) -> np.ndarray:
    p = np.asarray(pairs)
    if p.ndim != 2 or p.shape[1] != 3 or p.shape[0] == 0:
        raise ValueError(f"pairs must be a non-empty (P, 3) array of (i, j, same), got {p.shape}")
    if not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"pairs must hold integers, got dtype {p.dtype}")
    for col, n, name in ((0, n_query, "query_features"), (1, n_gallery, "gallery_features")):
        bad = np.nonzero((p[:, col] < 0) | (p[:, col] >= n))[0]
        if bad.size:
            raise ValueError(
                f"pair row {bad[0]}: index {p[bad[0], col]} out of range for {name} with {n} rows"
            )
    bad = np.nonzero((p[:, 2] != 0) & (p[:, 2] != 1))[0]
    if bad.size:
        raise ValueError(f"pair row {bad[0]}: 'same' must be 0 or 1, got {p[bad[0], 2]}")
    return p


def best_threshold(distances: np.ndarray, same: np.ndarray) -> float:
    """Threshold maximising the accuracy of "same iff distance < threshold".

    Exact search over all cuts of the sorted distances; the threshold is the midpoint between
    the two distances around the cut (-inf / +inf at the ends). Among equally good cuts the
    smallest threshold wins.
    """
    order = np.argsort(distances, kind="stable")
    d, s = distances[order], same[order].astype(np.int64)
    n = d.shape[0]
    # correct(m) = #same among the m smallest + #different among the rest, m = 0..n.
    correct = np.concatenate([[0], np.cumsum(2 * s - 1)]) + (n - s.sum())
    valid = np.ones(n + 1, dtype=bool)
    valid[1:n] = d[1:] > d[:-1]  # a cut inside a run of equal distances is not a threshold
    m = int(np.argmax(np.where(valid, correct, -1)))
    if m == 0:
        return -np.inf
    return np.inf if m == n else float((d[m - 1] + d[m]) / 2)


def _default_folds(same: np.ndarray, num_folds: int, seed: int) -> np.ndarray:
    """Seeded folds with (as nearly as possible) equal positives and negatives in each."""
    rng = np.random.default_rng(seed)
    folds = np.empty(same.shape[0], dtype=np.int64)
    for value in (0, 1):
        rows = rng.permutation(np.nonzero(same == value)[0])
        folds[rows] = np.arange(rows.shape[0]) % num_folds
    return folds


def verification_accuracy(
    query_features: Any,
    gallery_features: Any,
    pairs: Any,
    num_folds: int = 10,
    seed: int = 0,
    folds: Any = None,
) -> float:
    """Mean held-out accuracy over ``num_folds`` folds (CoReS 1:1 verification M).

    Args:
        query_features, gallery_features, pairs: see :func:`pair_distances`.
        folds: optional ``(P,)`` explicit fold ids (e.g. LFW pairs.txt: ``row // 600``); their
            distinct values are the folds and ``num_folds`` and ``seed`` are ignored.
    Returns:
        accuracy in [0, 1].
    """
    d = pair_distances(query_features, gallery_features, pairs)
    same = np.asarray(pairs)[:, 2].astype(np.int64)
    if folds is None:
        if not 2 <= num_folds <= d.shape[0]:
            raise ValueError(f"num_folds must be in [2, {d.shape[0]} pairs], got {num_folds}")
        folds = _default_folds(same, num_folds, seed)
    folds = np.asarray(folds)
    if folds.shape != d.shape:
        raise ValueError(f"folds must have shape ({d.shape[0]},) like pairs, got {folds.shape}")
    fold_ids = np.unique(folds)
    if fold_ids.shape[0] < 2:
        raise ValueError(f"need at least 2 distinct folds, got {fold_ids.tolist()}")
    accuracies = []
    for f in fold_ids:
        test = folds == f
        threshold = best_threshold(d[~test], same[~test])
        accuracies.append(np.mean((d[test] < threshold) == (same[test] == 1)))
    return float(np.mean(accuracies))
