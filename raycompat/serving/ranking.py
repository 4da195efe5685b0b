"""The one ranking every search does, from the CLI's to the service's: a version's index asked
for the top-``k`` of each query at the index's width.

A compatible model of another width is compared on the shared first coordinates
(:func:`to_width`: BCT's zero-padding, Shen et al. 2020, sec. 3.2), as in training. A zero query
on a cosine version is an error naming the query; a query that got fewer than ``k`` hits gets a
note saying why (a small version, or too few inverted lists visited).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from raycompat.index.distances import ZeroNormError

if TYPE_CHECKING:
    from raycompat.index.version_index import VersionIndex


def to_width(queries: np.ndarray, width: int) -> np.ndarray:
    """``(Q, width)`` contiguous float32 queries: a wider model's cut to the gallery's first
    ``width`` coordinates, a narrower one's zero-padded (BCT sec. 3.2: a compatible model shares
    the old model's first coordinates)."""
    shared = queries[:, :width]
    if shared.shape[1] < width:
        shared = np.pad(shared, ((0, 0), (0, width - shared.shape[1])))
    return np.ascontiguousarray(shared, dtype=np.float32)


def ranked_hits(
    index: VersionIndex,
    queries: np.ndarray,
    k: int,
    nprobe: int | None = None,
    names: list | None = None,
    model: str | None = None,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], str | None]:
    """``index.hits`` of the queries at the index's width, and a note when a query got fewer
    than ``k`` (else None): the one ranking every search does, from the CLI's to the
    service's (``raycompat/service/``), which keeps its indexes loaded. ``names``: what to
    call each query in a zero-vector error (default its row number)."""
    names = list(range(len(queries))) if names is None else names
    # nprobe tunes IVF indexes (large versions); an exact flat index has nothing to tune
    nprobe = nprobe if index.index.is_ivf else None
    try:
        hits = index.hits(to_width(queries, index.info.width), k, nprobe=nprobe)
    except ZeroNormError as err:
        bad = ", ".join(str(names[row]) for row in err.rows)
        who = f" for model {model}" if model is not None else ""
        raise ZeroNormError(
            f"query {bad} is a zero vector{who}: cosine search cannot rank the gallery for it",
            err.rows,
        ) from None
    short = [len(ids) for _, ids in hits if len(ids) < k]
    return hits, _short_note(index, k, nprobe, short, len(hits)) if short else None


def _short_note(
    index: VersionIndex, k: int, nprobe: int | None, short: list[int], queries: int
) -> str:
    """Why ``short`` (hit counts below k) of ``queries`` queries got fewer than ``k`` hits."""
    rows, version = index.index.ntotal, index.info.version
    if rows < k:
        why = f"version {version} holds {rows} rows"
    else:
        lists = nprobe or index.index.index.nprobe
        why = f"the {lists} inverted list(s) visited per query hold fewer; raise --nprobe"
    fewest = min(short)
    return f"{len(short)} of {queries} queries got fewer than -k {k} hits (fewest {fewest}): {why}"
