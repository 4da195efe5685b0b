"""A synthetic published version for the benchmarks, and timing of interleaved pairs.

``publish_mixture`` writes unit rows around random centres (the data of ``index_scale.py``)
into a local store; ``paired`` times ours and a baseline alternately, so that a change of the
machine's load hits both, and reports the median of each and of their per-pair ratios.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pyarrow.parquet as pq

from raycompat.index.stdout import stdout_to_stderr
from raycompat.store import GalleryStore, StoreError, VersionInfo, embedding_table

GALLERY = "bench"


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def mixture(rng: np.random.Generator, centres: np.ndarray, n: int, noise: float = 1.0):
    """``(n, d)`` unit rows: a random centre plus isotropic noise of norm about ``noise``."""
    picked = centres[rng.integers(0, len(centres), n)]
    scale = noise / np.sqrt(picked.shape[1])
    return unit(picked + rng.normal(size=picked.shape).astype(np.float32) * scale)


def centres_of(width: int, count: int = 1000, seed: int = 0) -> np.ndarray:
    return unit(np.random.default_rng(seed).normal(size=(count, width)))


def publish_mixture(
    root: str,
    version: str,
    rows: int,
    width: int,
    *,
    part_rows: int = 250_000,
    dtype: str = "float32",
    seed: int = 1,
) -> VersionInfo:
    """Publish ``rows x width`` unit rows (int64 ids) as ``bench/<version>``, unless it exists."""
    store = GalleryStore(root)
    try:
        return store.version(GALLERY, version)  # published by an earlier run (--store DIR)
    except StoreError:
        pass
    info = VersionInfo(version, "bench", width, True, f"{version} = bench", dtype=dtype)
    staging = store.begin(GALLERY, info)
    rng, centres = np.random.default_rng(seed), centres_of(width)
    for part, start in enumerate(range(0, rows, part_rows)):
        n = min(part_rows, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        table = embedding_table(ids, mixture(rng, centres, n))
        staging.write_table(table, f"p-{part:05d}.parquet")
    staging.commit(expected_rows=rows)
    return store.version(GALLERY, version)


def paired(
    ours: Callable[[], object],
    baseline: Callable[[], object],
    pairs: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    """Time ``ours`` and ``baseline`` alternately ``pairs`` times (who goes first alternates);
    seconds per call: medians of each, and the median of the per-pair ratios ours / baseline.
    ``clock``: wall time, or ``time.process_time`` (this process's CPU time, every thread's:
    steadier than wall time on a machine other work loads)."""
    ours_s, base_s = [], []
    for k in range(pairs):
        order = [(ours, ours_s), (baseline, base_s)]
        for fn, out in order if k % 2 == 0 else order[::-1]:
            start = clock()
            fn()
            out.append(clock() - start)
    ratios = [a / b for a, b in zip(ours_s, base_s, strict=True)]
    return {
        "ours_s": statistics.median(ours_s),
        "baseline_s": statistics.median(base_s),
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages (above the CPU count means contended)."""
    return [round(v, 2) for v in os.getloadavg()]


def one_at_a_time(search_one: Callable, queries: np.ndarray) -> Callable[[], None]:
    """A call that searches ``queries`` one at a time (a batch of 1 each), for :func:`paired`."""

    def run() -> None:
        for q in queries:
            search_one(q[None])

    return run


def per_query(result: dict, n: int) -> dict:
    """:func:`paired`'s seconds per call of ``n`` queries -> milliseconds per query."""
    return {
        "ours_ms": 1e3 * result["ours_s"] / n,
        "baseline_ms": 1e3 * result["baseline_s"] / n,
        "ratio": result["ratio_median"],
        "ratios": [round(r, 3) for r in result["ratios"]],
    }


class FaissScript:
    """The search benchmarks' baseline, what a user would write: the build's files read by
    faiss (its lists on disk beside it unless ``on_disk`` is False), ids in a NumPy array, the
    top ``k``. ``nprobe`` / ``prefetch``: set on the index as read (None: as the file has it)."""

    def __init__(
        self,
        folder: Path,
        k: int,
        *,
        on_disk: bool = True,
        nprobe: int | None = None,
        prefetch: int | None = None,
    ):
        flags = faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY if on_disk else 0
        with stdout_to_stderr():  # faiss prints where it found the lists
            self.index = faiss.read_index(str(folder / "index.faiss"), flags)
        if nprobe is not None:
            self.index.nprobe = nprobe
        if prefetch is not None:
            lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(self.index).invlists)
            lists.prefetch_nthread = prefetch
        self.ids = pq.read_table(folder / "ids.parquet").column("id").to_numpy()
        self.k = k

    def search(self, queries: np.ndarray) -> np.ndarray:
        q = np.array(queries, dtype=np.float32)
        faiss.normalize_L2(q)
        _, rows = self.index.search(q, self.k)
        return self.ids[rows]
