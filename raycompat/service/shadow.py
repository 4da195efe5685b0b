"""Shadow traffic: a candidate version searched in the background with the served queries.

``--shadow G/M=V`` runs every search of model M on gallery G a second time, against version V
(a candidate: a backfill, a new extraction with the same ids), in one background thread,
after the answer is computed; it never changes an answer or waits for one. Per query it
measures, as Prometheus metrics labelled ``gallery``, ``model`` and ``candidate``:

- ``raycompat_shadow_overlap_at_k``: ``|top-k(served) & top-k(candidate)| / k``, a histogram;
- ``raycompat_shadow_negative_flips_total`` over ``raycompat_shadow_labelled_queries_total``:
  the online negative-flip rate (Yan et al. 2021, "Positive-congruent training"): a query
  given by ``ids`` whose stored label is known, whose served top-1 (the query's own row left
  out) has its label and whose candidate top-1 does not. Labels are the candidate version's
  ``label`` column (the same items in both versions).

A candidate that is the version served is not compared. When ``max_pending`` comparisons wait,
the next is skipped and counted (``raycompat_shadow_skipped_total``): shadow work never queues
without bound behind live traffic.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from raycompat.errors import ConfigError
from raycompat.store import GalleryStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShadowSpec:
    """Searches of ``model`` on ``gallery`` are shadowed on ``version``."""

    gallery: str
    model: str
    version: str

    @classmethod
    def parse(cls, text: str, key: str = "--shadow") -> ShadowSpec:
        """``"G/M=V"`` -> the spec; anything else is a :class:`ConfigError` naming ``key`` (the
        option or config key it came from) and the form."""
        pair, _, version = text.partition("=")
        gallery, _, model = pair.partition("/")
        if not (gallery and model and version) or "/" in model:
            raise ConfigError(f"{key} {text!r}: expected GALLERY/MODEL=VERSION, e.g. g/m1=v3")
        return cls(gallery, model, version)


class Shadow:
    """The comparisons of every shadowed pair; see the module docstring."""

    def __init__(self, store: GalleryStore, specs, metrics, max_pending: int = 64) -> None:
        self.store, self.metrics, self.max_pending = store, metrics, max_pending
        self.candidates = {(s.gallery, s.model): s.version for s in specs}
        self._loaded: dict[tuple, tuple] = {}  # (gallery, version) -> (index, labels)
        self._pending, self._lock = 0, threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="raycompat-shadow")

    def observe(self, loaded, queries: np.ndarray, query_ids, served_ids: list, k: int) -> None:
        """Compare the answer ``served_ids`` (one id array per query) of ``loaded`` with the
        candidate's, in the background; returns at once."""
        candidate = self.candidates.get((loaded.gallery, loaded.model))
        if candidate is None or candidate == loaded.version:
            return
        names = (loaded.gallery, loaded.model, candidate)
        with self._lock:
            if self._pending >= self.max_pending:
                self.metrics.shadow_skipped.labels(*names).inc()
                return
            self._pending += 1
        work = self._executor.submit(self._compare, names, queries, query_ids, served_ids, k)
        work.add_done_callback(self._done)

    def _done(self, work: Future) -> None:
        with self._lock:
            self._pending -= 1
        if work.exception() is not None:
            logger.warning("a shadow comparison failed: %s", work.exception())

    def _compare(self, names: tuple, queries, query_ids, served_ids: list, k: int) -> None:
        from raycompat.serving.ranking import ranked_hits

        gallery, _, candidate = names
        index, labels = self._candidate(gallery, candidate)
        found, _ = ranked_hits(index, queries, k)
        for q, (served, (_, shadow)) in enumerate(zip(served_ids, found, strict=True)):
            common = set(map(str, served.tolist())) & set(map(str, shadow.tolist()))
            self.metrics.shadow_overlap.labels(*names).observe(len(common) / k)
            truth = labels.get(str(query_ids[q])) if query_ids is not None else None
            if truth is None:
                continue
            self.metrics.shadow_labelled.labels(*names).inc()
            served_right = _top1_label(served, query_ids[q], labels) == truth
            if served_right and _top1_label(shadow, query_ids[q], labels) != truth:
                self.metrics.shadow_flips.labels(*names).inc()

    def _candidate(self, gallery: str, version: str) -> tuple:
        """The candidate's index and ``{str(id): label}`` (empty without labels), loaded once."""
        if (gallery, version) not in self._loaded:
            from raycompat.index.version_index import open_search_index
            from raycompat.serving.labels import column_names

            index, _ = open_search_index(self.store, gallery, version, use_gpu=False)
            labels = {}
            if "label" in column_names(self.store, gallery, version):
                for batch in self.store.iter_batches(gallery, version, columns=["id", "label"]):
                    ids, values = batch.column("id").to_pylist(), batch.column("label")
                    labels.update(zip(map(str, ids), values.to_pylist(), strict=True))
            self._loaded[(gallery, version)] = (index, labels)
        return self._loaded[(gallery, version)]

    def flush(self) -> None:
        """Wait for every comparison submitted so far (one worker: they run in order)."""
        self._executor.submit(lambda: None).result()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _top1_label(ids: np.ndarray, query_id, labels: dict):
    """The label of the first hit that is not the query's own row (None: no such hit)."""
    for i in ids.tolist():
        if str(i) != str(query_id):
            return labels.get(str(i))
    return None
