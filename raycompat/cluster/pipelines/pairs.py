"""Pairs for a training-free map, from a seeded sample of a stored version, on the workers.

    stats = sample_pair_statistics(store, "faces", "v1", images, "runs/m2", pairs=5000, seed=0)
    fit = fit_procrustes(stats)                  # raycompat.transformations.fit

A map between two models' spaces (issue 41: ``procrustes``, ``affine``, ``adapter``) is fitted
on items embedded by both. The stored version holds the old model's embeddings; the new model
re-embeds a sample of its rows from the gallery's images (ids are row numbers of the image
source, as extraction and the partial backfill take them). One Ray task per chunk of the
version (:func:`~raycompat.cluster.pipelines.inputs.plan_version_chunks`) keeps a row when a
seeded key of its id (``selection.random_keys``, the partial backfill's random order) falls
below ``pairs / rows`` (or below a given ``fraction``), so the sample is the same whatever the
chunking, the workers or a rerun, and has ``pairs`` rows in expectation. Each task
returns the sample's :class:`~raycompat.transformations.PairStatistics` (O(d^2), whatever its
rows); the driver merges them: nothing on the driver grows with the version's rows. The
``adapter`` kind trains on the rows themselves, so with ``keep_rows`` the tasks also return
their sampled pairs (O(pairs) on the driver, the budget the user set).

``exclude``: ids never sampled (the upgrade job passes its validation and test rows when the
gallery's images are its training data, so a map is never fitted on what it is scored on); the
others are sampled at ``pairs / (rows - excluded)``, so the sample still has ``pairs`` rows in
expectation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
import torch

from raycompat.cluster.pipelines.extract import embed
from raycompat.cluster.pipelines.index import RayTasks
from raycompat.cluster.pipelines.inputs import iter_chunk_batches, plan_version_chunks
from raycompat.cluster.pipelines.parts import Chunk
from raycompat.cluster.pipelines.selection import random_keys
from raycompat.cluster.pipelines.sources import images_of_rows, open_source, source_name
from raycompat.cluster.pipelines.weights import Shared, model_of, share_model
from raycompat.config.pipelines import RunOptions, SourceSpec
from raycompat.store import GalleryStore, VersionInfo
from raycompat.store.read.vectors import vectors
from raycompat.transformations import PairsError, PairStatistics

logger = logging.getLogger(__name__)
DIRECTIONS = ("query", "gallery")  # x -> y: new -> stored (query side), stored -> new (gallery)


def sample_fraction(pairs: int, rows: int) -> float:
    """The share of rows to sample for ``pairs`` of ``rows`` (1.0: every row): a row is kept
    when its seeded key (``selection.random_keys``, in [0, 1)) falls below it."""
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    return min(1.0, pairs / rows)


@dataclass(frozen=True)
class PairSample:
    """What to sample and how to embed it: every task gets one (picklable)."""

    images: SourceSpec
    model: Shared | str  # the new model: a shared reference, or a folder (in process)
    fraction: float
    seed: int
    direction: str
    gram: bool
    keep_rows: bool
    exclude: pa.Array | None
    batch_size: int


def chunk_pairs(store: GalleryStore, info: VersionInfo, chunk: Chunk, sample: PairSample):
    """``(statistics, x, y)`` of one chunk's sampled rows (``x``, ``y`` None unless
    ``keep_rows``); the statistics are None when the chunk has no sampled row. The model and
    the image source are opened only for a chunk that has one."""
    torch.set_num_threads(1)
    where = store.backend.uri(chunk.path)
    model = source = stats = None
    kept = []
    columns = ["id", "embedding"]
    for batch in iter_chunk_batches(store, chunk, info, sample.batch_size, columns):
        ids = batch.column("id")
        chosen = random_keys(ids, sample.seed) < sample.fraction
        if sample.exclude is not None:
            outside = pc.invert(pc.is_in(ids, value_set=sample.exclude.cast(ids.type)))
            chosen &= outside.to_numpy(zero_copy_only=False)
        if not chosen.any():
            continue
        if model is None:
            model, source = model_of(sample.model), open_source(sample.images)
        rows = ids.to_numpy(zero_copy_only=False)[chosen]
        images = images_of_rows(source, rows, where, source_name(sample.images))
        stored = vectors(batch, "embedding")[chosen]
        new = embed(model, images, None, normalize=False).numpy()
        x, y = (new, stored) if sample.direction == "query" else (stored, new)
        part = PairStatistics.of(x, y, gram=sample.gram, where=f"{where} (sampled rows)")
        stats = part if stats is None else stats.merge(part)
        if sample.keep_rows:
            kept.append((x, y))
    if not sample.keep_rows or not kept:
        return stats, None, None
    return stats, np.concatenate([k[0] for k in kept]), np.concatenate([k[1] for k in kept])


def chunk_matches(
    store: GalleryStore, info: VersionInfo, chunk: Chunk, wanted: pa.Array, columns: list
) -> pa.Table | None:
    """The rows of one chunk whose id is in ``wanted`` (``id`` and ``columns``), or None."""
    found = []
    for batch in iter_chunk_batches(store, chunk, info, 65536, ["id", *columns]):
        ids = batch.column("id")
        kept = batch.filter(pc.is_in(ids, value_set=wanted.cast(ids.type)))
        if kept.num_rows:
            found.append(kept)
    return pa.Table.from_batches(found) if found else None


def stored_matches(
    store: GalleryStore, gallery: str, version: str, ids: list, columns: list, *, workers: int = 2
) -> tuple[dict, pa.Table]:
    """``(id -> row, table)`` of the version's rows holding ``ids``, as
    ``raycompat.serving.stored_rows.stored_rows`` gives them, from ``workers`` Ray tasks at a
    time, one per chunk of the version, each returning only its matches: the driver holds the
    ids and the matched rows (O(pairs)), never a chunk of the version."""
    info = store.version(gallery, version)
    chunks, _, _ = plan_version_chunks(store, gallery, info, RunOptions().rows_per_file)
    runner = RayTasks(workers, 1, RunOptions().progress_every_s)
    refs = ray.put(store), ray.put(info), ray.put(pa.array(ids))
    tables = runner.map(
        chunk_matches,
        [(refs[0], refs[1], chunk, refs[2], columns) for chunk in chunks],
        name=f"pairs join {gallery}/{version}",
        rows=[chunk.rows for chunk in chunks],
    )
    found = [t for t in tables if t is not None]
    table = pa.concat_tables(found) if found else pa.table({})
    ids_found = table.column("id").to_pylist() if found else []
    return {i: k for k, i in enumerate(ids_found)}, table


def sample_pair_statistics(
    store: GalleryStore,
    gallery: str,
    version: str,
    images: SourceSpec,
    model: str,
    *,
    pairs: int | None = None,
    fraction: float | None = None,
    seed: int = 0,
    direction: str = "query",
    gram: bool = True,
    keep_rows: bool = False,
    exclude: np.ndarray | None = None,
    run: RunOptions | None = None,
) -> tuple[PairStatistics, np.ndarray | None, np.ndarray | None]:
    """The statistics of a seeded sample of about ``pairs`` rows of ``gallery/version`` (or of
    the share ``fraction`` of its rows not excluded: give one of the two), paired
    with the exported ``model``'s embeddings of the same images (module docstring), and with
    ``keep_rows`` the pairs ``(x, y)`` themselves. ``direction``: ``"query"`` maps the new
    model's space into the stored one (``x`` new, ``y`` stored), ``"gallery"`` the reverse.
    Runs ``run.actors`` Ray tasks at a time, ``run.threads_per_actor`` CPUs each.

    Raises:
        PairsError: the sample holds no row (the version is empty, or everything is excluded).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    if (pairs is None) == (fraction is None):
        raise ValueError(f"give pairs or fraction, not both or neither: {pairs}, {fraction}")
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    run = run or RunOptions()
    info = store.version(gallery, version)
    chunks, _, _ = plan_version_chunks(store, gallery, info, run.rows_per_file)
    if fraction is None:
        eligible = info.rows - (0 if exclude is None else len(exclude))  # excluded: assumed held
        fraction = sample_fraction(pairs, max(eligible, 1))
    sample = PairSample(
        images, share_model(model), fraction, seed, direction, gram,
        keep_rows, None if exclude is None else pa.array(exclude), run.batch_size,
    )  # fmt: skip
    store_ref, info_ref, sample_ref = ray.put(store), ray.put(info), ray.put(sample)
    runner = RayTasks(run.actors, run.threads_per_actor, run.progress_every_s)
    results = runner.map(
        chunk_pairs,
        [(store_ref, info_ref, chunk, sample_ref) for chunk in chunks],
        name=f"pairs {gallery}/{version}",
        rows=[chunk.rows for chunk in chunks],
    )
    found = [r for r in results if r[0] is not None]
    if not found:
        raise PairsError(f"{store.uri(gallery)}: the sample of version {version} holds no row")
    stats = found[0][0]
    for part, _, _ in found[1:]:
        stats = stats.merge(part)
    logger.info("pairs %s/%s: %d sampled rows of %d", gallery, version, stats.count, info.rows)
    if not keep_rows:
        return stats, None, None
    return stats, np.concatenate([r[1] for r in found]), np.concatenate([r[2] for r in found])
