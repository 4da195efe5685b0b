"""What a service replica serves: one :class:`~raycompat.service.loaded.Loaded` per (gallery,
model) pair, following the store's serving records.

:meth:`Served.follow` brings one pair up to date: it counts the model's alias records and
looks for its retired tombstone (a listing and a stat, no record read; ``store/aliases.py`` is
append-only, so the same count means the same log). On a change it reads what the model serves
now (``aliases.current``: promote, rollback, revoke, retire), loads and warms the new version's
index beside the old one, then replaces the pair's reference in one assignment: a request
holds the reference it took at its start and finishes on it, and the old index is freed when
the last such request ends. A revoked or retired model is dropped at once and answers 404
from then on. Each swap is logged and counted (``metrics.py``).

:meth:`Served.refresh` (the watcher's poll, ``watcher.py``) finds every pair of the store and
follows each; :meth:`Served.for_request` follows the pair asked before each search when the
config's ``check_each_request`` is on (the default), so no answer comes from a version the
records stopped serving before the request began.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from raycompat.errors import NotInStoreError, StoreError
from raycompat.registry import did_you_mean
from raycompat.service.loaded import Loaded, load
from raycompat.service.metrics import ServiceMetrics
from raycompat.store import GalleryStore
from raycompat.store.aliases import changes, current
from raycompat.store.retired import retired
from raycompat.store.serving import query_models

logger = logging.getLogger(__name__)
Pair = tuple[str, str]


class NotServedError(NotInStoreError):
    """The gallery is not in the store, the model does not query it, or the model was revoked
    there or retired: the service answers 404 with this message (it lists the valid names)."""


class Served:
    """The pairs a replica serves; see the module docstring."""

    def __init__(self, store: GalleryStore, metrics: ServiceMetrics | None = None) -> None:
        self.store = store
        self.metrics = metrics or ServiceMetrics()
        self._loaded: dict[Pair, Loaded] = {}
        self._gone: dict[Pair, tuple[str, int]] = {}  # serves nothing: why, at which count
        self._locks: dict[Pair, threading.Lock] = {}

    def refresh(self) -> None:
        """Find every (gallery, model) pair of the store and follow each; forget pairs gone
        from the store. A pair whose records cannot be read keeps what it served (logged)."""
        pairs = [(g, m) for g in self.store.galleries() for m in query_models(self.store, g)]
        for pair in pairs:
            try:
                self.follow(*pair, again=True)
            except StoreError as error:
                logger.warning("%s/%s: serving records unreadable, kept as is: %s", *pair, error)
        for pair in set(dict(self._loaded)) | set(dict(self._gone)):
            if pair not in pairs:
                self._drop(pair, f"model {pair[1]} no longer queries gallery {pair[0]}", -1)

    def for_request(self, gallery: str, model: str, check: bool = True) -> Loaded:
        """The snapshot a request answers from, followed first when ``check``.

        Raises:
            NotServedError: unknown gallery or model (the valid names listed), or the model is
                revoked there or retired (why).
        """
        pair = (gallery, model)
        if pair not in self._loaded and pair not in self._gone:
            raise NotServedError(self._unknown(gallery, model))
        loaded = self.follow(gallery, model) if check else self._loaded.get(pair)
        if loaded is None:
            raise NotServedError(self._gone.get(pair, (f"model {model} serves nothing",))[0])
        return loaded

    def follow(self, gallery: str, model: str, again: bool = False) -> Loaded | None:
        """Bring the pair up to date with its records (see the module docstring); the pair's
        snapshot now, or None when it serves nothing. A pair that served nothing at the same
        alias-log length still serves nothing, unless ``again`` (the watcher's poll) reads
        its records anyway: a grant written since changes no alias log."""
        pair = (gallery, model)
        now = self._loaded.get(pair)
        if now is not None and self._unchanged(now):
            return now
        gone = self._gone.get(pair)
        if not again and gone and gone[1] == changes(self.store, gallery, model):
            return None  # still revoked, retired, or without a grant
        # one load per pair, the others wait for it (setdefault: one lock, even in a race)
        with self._locks.setdefault(pair, threading.Lock()):
            now = self._loaded.get(pair)
            count = changes(self.store, gallery, model)
            if now is not None and now.changes == count and retired(self.store, model) is None:
                return now
            try:
                serving = current(self.store, gallery, model)
            except StoreError as error:  # revoked, retired, or no grant (yet)
                self._drop(pair, str(error), count)
                return None
            if now is not None and now.version == serving.gallery_version:
                now = dataclasses.replace(now, changes=count)  # e.g. a promote rolled back
            else:
                now = load(self.store, serving, count, on_free=self.metrics.freed_index)
                self._swap(pair, now)
            self._loaded[pair] = now
            self._gone.pop(pair, None)
            return now

    def _unchanged(self, now: Loaded) -> bool:
        count = changes(self.store, now.gallery, now.model)
        return count == now.changes and retired(self.store, now.model) is None

    def _swap(self, pair: Pair, new: Loaded) -> None:
        old = self._loaded.get(pair)
        was = old.version if old is not None else None
        logger.info("swap %s/%s: %s -> %s (%s)", *pair, was or "nothing", new.version, new.source)
        self.metrics.swapped(*pair, was, new.version)

    def _drop(self, pair: Pair, why: str, count: int) -> None:
        old = self._loaded.pop(pair, None)
        self._gone[pair] = (why, count)
        if old is not None:
            logger.info("swap %s/%s: %s -> nothing: %s", *pair, old.version, why)
            self.metrics.swapped(*pair, old.version, None)

    def _unknown(self, gallery: str, model: str) -> str:
        pairs = set(dict(self._loaded)) | set(dict(self._gone))
        galleries = sorted({g for g, _ in pairs})
        if gallery not in galleries:
            names = ", ".join(galleries) or "none"
            return f"gallery {gallery!r} is not served: galleries are {names}" + did_you_mean(
                gallery, galleries
            )
        models = sorted(m for g, m in pairs if g == gallery)
        return (
            f"model {model!r} does not query gallery {gallery!r}: its models are "
            f"{', '.join(models)}" + did_you_mean(model, models)
        )

    def listing(self) -> dict:
        """``{gallery: {model: {"version", "index", "metric"} | {"serves": None, "why"}}}``."""
        out: dict[str, dict] = {}
        loaded, gone = dict(self._loaded), dict(self._gone)  # copies: a swap may land meanwhile
        for (gallery, model), now in sorted(loaded.items(), key=lambda item: item[0]):
            out.setdefault(gallery, {})[model] = now.describe()
        for (gallery, model), (why, _) in sorted(gone.items(), key=lambda item: item[0]):
            out.setdefault(gallery, {})[model] = {"serves": None, "why": why}
        return out
