"""Publish a version's index only after measuring it: recall@10 recorded, a better index kept.

    build = build_measured_index(store, "faces", "v3", kind="ivfpq")   # raycompat index build
    build.recall        # {"recall": 0.926, "k": 10, "queries": 1000, "seed": 0}
    build.previous      # recall@10 of the index it replaced (None: none was published)

The new build is staged (:func:`~raycompat.index.version_index.stage_version_index`: its files
written, the pointer untouched), loaded as a reader would (checksums verified), and its recall@k
measured against exact search on ``queries`` (default 1000) stored rows sampled with ``seed``
(:func:`raycompat.index.recall.estimate_recall`: the driver holds the sample and its top-k,
the exact search streams the version batch by batch). The recall goes into the pointer it
publishes. An index already published whose recall is higher by more than ``tolerance``
(0.005) is kept: :class:`WorseIndexError`, nothing replaced, the refused build's folder
deleted (a ``sharded_ivf`` folder is kept, a rerun resumes it); ``force=True`` replaces it.
The published index's recall is the one its pointer records, or is measured on the same
sample when it records none (built by a program that called ``build_version_index``); an
unreadable or corrupt published index is replaced. A ``sharded_ivf`` rebuild with the same
parameters rewrites its own build folder in place (:mod:`raycompat.index.sharded`), so it is
published whatever it measures: the pointer must name the files as they now are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from raycompat.errors import CorruptIndexError, DataError
from raycompat.index.ivf import SHARDED_IVF
from raycompat.index.recall import estimate_recall
from raycompat.index.version_index import (
    load_pointer_index,
    pointer_uri,
    publish_version_index,
    published_pointer,
    stage_version_index,
)
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import INDEX_DIR, VersionInfo

logger = logging.getLogger(__name__)

RECALL_QUERIES = 1000  # stored rows sampled as queries: recall to about +-0.01 at 0.9
RECALL_TOLERANCE = 0.005  # a rebuild measuring this much below the published one still replaces


class WorseIndexError(DataError):
    """A new index build measures a lower recall than the published one; nothing was replaced.
    The message names both recalls and ``--force``. Exit status 1."""


@dataclass(frozen=True)
class MeasuredBuild:
    """A published build: its URI, kind, measured recall (``{"recall", "k", "queries",
    "seed"}``) and the recall@k of the index it replaced (None: none was published)."""

    uri: str
    kind: str
    recall: dict
    previous: float | None


def build_measured_index(
    store: GalleryStore,
    gallery: str,
    version: str,
    *,
    force: bool = False,
    queries: int = RECALL_QUERIES,
    seed: int = 0,
    tolerance: float = RECALL_TOLERANCE,
    **build_options: Any,
) -> MeasuredBuild:
    """Stage, measure and publish the index of ``gallery/version`` (module docstring).

    Args:
        force: replace a published index even when it measures a higher recall.
        build_options: as :func:`~raycompat.index.version_index.stage_version_index`.
    Raises:
        WorseIndexError: the published index's recall exceeds the new one's by more than
            ``tolerance`` and not ``force``.
    """
    info = store.version(gallery, version)
    pointer = stage_version_index(store, gallery, version, **build_options)
    source = store.uri(gallery, INDEX_DIR, version, pointer["build"])
    staged = load_pointer_index(store, gallery, info, pointer, source, use_gpu=False)
    measured = estimate_recall(store, gallery, staged, queries=queries, seed=seed)
    pointer["recall"] = {**measured, "seed": seed}
    del staged  # a remote sharded build's local copy goes with it
    current = _current(store, gallery, info)
    previous = None if current is None else _recall_of(store, gallery, info, current, queries, seed)
    new = measured["recall"]
    resumed = current is not None and current["build"] == pointer["build"]
    if previous is not None and new < previous - tolerance and not (force or resumed):
        _discard(store, gallery, version, pointer)
        raise WorseIndexError(
            f"{gallery}/{version}: the new {pointer['kind']} index measures recall@"
            f"{measured['k']} {new:.4f}, below the published {current['kind']} "
            f"index's {previous:.4f} (on {measured['queries']} sampled rows); nothing "
            f"replaced, rerun with --force to replace it"
        )
    uri = publish_version_index(store, gallery, info, pointer)
    return MeasuredBuild(uri, pointer["kind"], pointer["recall"], previous)


def _current(store: GalleryStore, gallery: str, info: VersionInfo) -> dict | None:
    """The published pointer; None when there is none or it is unreadable (then replaced)."""
    try:
        return published_pointer(store, gallery, info.version)
    except CorruptIndexError as error:
        logger.warning("replacing the index of %s/%s: %s", gallery, info.version, error)
        return None


def _recall_of(
    store: GalleryStore, gallery: str, info: VersionInfo, pointer: dict, queries: int, seed: int
) -> float | None:
    """The recall the published ``pointer`` records, else measured on the same sample; None
    when its build is corrupt (it is then replaced)."""
    recorded = pointer.get("recall")
    if isinstance(recorded, dict) and isinstance(recorded.get("recall"), (int, float)):
        return float(recorded["recall"])
    source = pointer_uri(store, gallery, info.version)
    try:
        index = load_pointer_index(store, gallery, info, pointer, source, use_gpu=False)
    except CorruptIndexError as error:
        logger.warning("replacing the index of %s/%s: %s", gallery, info.version, error)
        return None
    return estimate_recall(store, gallery, index, queries=queries, seed=seed)["recall"]


def _discard(store: GalleryStore, gallery: str, version: str, pointer: dict) -> None:
    """Delete a refused build's folder (its name is this build's own); a ``sharded_ivf``
    folder stays, so that a rerun with ``--force`` resumes it."""
    if pointer["kind"] != SHARDED_IVF:
        store.filesystem.delete_dir(store.path(gallery, INDEX_DIR, version, pointer["build"]))
