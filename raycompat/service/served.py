"""What a service replica serves: one :class:`~raycompat.service.loaded.Loaded` per route (a
(gallery, model) pair, or a gallery's named alias: ``routes.py``), following the store's
serving records.

:meth:`Served.follow` brings one route up to date: it takes the route's state, a fingerprint
of its records from listings and stats (``routes.py``; the logs are append-only, so the same
state means the same answer). On a change it reads what the route serves now (a model's
``served_log.current``: promote, rollback, revoke, retire; an alias's newest record, refused once
its model is revoked or retired), loads and warms the new version's index beside the old one,
then replaces the route's reference in one assignment: a request holds the reference it took
at its start and finishes on it, and the old index is freed when the last such request ends.
A route that serves nothing any more is dropped at once and answers 404 from then on. Each
swap is logged and counted (``metrics.py``).

An index published for the version a route serves (``raycompat index build`` after an
adopt, which publishes first; a rebuild) is followed the same way: the watcher's poll
compares the version's index pointer with the one read before the load
(:meth:`Loaded.index_moved`, one small read per route and poll) and, when it changed, loads
and warms the new index beside the old one and swaps it in (logged ``swap G/M: v1, index
exact -> build ...``). Only the poll looks: a search answered by the previous index of the
same version (the exact search, say) is still an answer of the version the records serve.

:meth:`Served.refresh` (the watcher's poll, ``watcher.py``) finds every route of the store and
follows each; :meth:`Served.for_request` follows the route asked before each search when the
config's ``check_each_request`` is on (the default), so no answer comes from a version the
records stopped serving before the request began.

A route whose records name a version this replica cannot load (a corrupt or missing file; no
index and too many rows to search exactly) is *unloadable*: its searches answer 503 naming why
(:class:`UnloadableError`), the watcher tries again at each poll (its warning logged once a
minute or when it changes: ``throttle.py``), and :meth:`Served.counts` says how many routes
are loaded and how many are unloadable (``/readyz``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import astuple

from raycompat.errors import NotInStoreError, StoreError
from raycompat.registry import did_you_mean
from raycompat.service.loaded import Loaded, load
from raycompat.service.metrics import ServiceMetrics
from raycompat.service.routes import ROUTES, Route
from raycompat.service.throttle import Throttle
from raycompat.store import GalleryStore

logger = logging.getLogger(__name__)


class NotServedError(NotInStoreError):
    """The gallery is not in the store, the model does not query it (or it has no such
    alias), or the route serves nothing now (revoked, retired): the service answers 404 with
    this message (it lists the valid names)."""


class UnloadableError(StoreError):
    """The records name a version this replica cannot load, or cannot be read: the service
    answers 503 with this message (the route, the version and the store's error)."""


class Served:
    """The routes a replica serves; see the module docstring."""

    def __init__(self, store: GalleryStore, metrics: ServiceMetrics | None = None) -> None:
        self.store = store
        self.metrics = metrics or ServiceMetrics()
        self.kinds = {kind: routes() for kind, routes in ROUTES.items()}
        self._loaded: dict[Route, Loaded] = {}
        self._gone: dict[Route, tuple[str, tuple]] = {}  # serves nothing: why, at which state
        self._broken: dict[Route, tuple[str, tuple | None]] = {}  # unloadable: why, state
        self._locks: dict[Route, threading.Lock] = {}
        self._warned = Throttle()

    def refresh(self) -> None:
        """Find every route of the store and :meth:`poll` each; forget routes gone from the
        store."""
        found = [
            Route(gallery, name, kind)
            for gallery in self.store.galleries()
            for kind, routes in self.kinds.items()
            for name in routes.names(self.store, gallery)
        ]
        for route in found:
            self.poll(route)
        for route in set(dict(self._loaded)) | set(dict(self._gone)) | set(dict(self._broken)):
            if route not in found:
                self._drop(route, f"{route} is no longer in the store", ())

    def poll(self, route: Route) -> None:
        """The watcher's look at one route: :meth:`follow` it, its index pointer included,
        and trying again what could not be loaded. A route whose records cannot be read, or
        whose new version or index cannot be loaded, keeps what it served (logged once a
        minute, or on a change)."""
        try:
            self.follow(route, again=True)
        except UnloadableError as error:
            self._warn(route, f"{error}; {self._kept(route)}")
        except StoreError as error:
            if route not in self._loaded and route not in self._broken:
                self._broken[route] = (f"{route}: serving records unreadable: {error}", None)
            self._warn(route, f"{route}: serving records unreadable, {self._kept(route)}: {error}")

    def _kept(self, route: Route) -> str:
        now = self._loaded.get(route)
        return "serving nothing" if now is None else f"kept serving {now.version}"

    def _warn(self, route: Route, message: str) -> None:
        if self._warned.due(route, message):
            logger.warning(
                "%s (retried each poll; logged again on a change or in a minute)", message
            )

    def for_request(self, route: Route, check: bool = True) -> Loaded:
        """The snapshot a request answers from, followed first when ``check``.

        Raises:
            NotServedError: an unknown gallery, model or alias (the valid names listed), or
                the route serves nothing now (why).
            UnloadableError: the version its records name cannot be loaded here (why).
        """
        loaded = self._loaded.get(route)
        if loaded is not None and not check:
            return loaded  # the --poll-only path (and a gallery handle's): one lookup
        if loaded is None and route not in self._gone and route not in self._broken:
            raise NotServedError(self._unknown(route))
        loaded = self.follow(route) if check else loaded
        if loaded is None and route in self._broken:
            raise UnloadableError(self._broken[route][0])
        if loaded is None:
            raise NotServedError(self._gone.get(route, (f"{route} serves nothing",))[0])
        return loaded

    def follow(self, route: Route, again: bool = False) -> Loaded | None:
        """Bring the route up to date with its records (see the module docstring); its
        snapshot now, or None when it serves nothing. A route that served nothing at the same
        state still serves nothing, unless ``again`` (the watcher's poll) reads its records
        anyway: a grant written since changes no alias log. A route whose version could not
        be loaded at the same state raises its :class:`UnloadableError` again without
        loading, unless ``again``. Only with ``again`` is the version's index pointer read: a
        new index of the version served is loaded and swapped in."""
        routes = self.kinds[route.kind]
        state = routes.state(self.store, route.gallery, route.name)
        now = self._loaded.get(route)
        if self._current(now, state, again):
            return now
        gone, broken = self._gone.get(route), self._broken.get(route)
        if not again and gone and gone[1] == state:
            return None  # still revoked, retired, or without a grant
        if not again and broken and broken[1] == state:
            raise UnloadableError(broken[0])  # the watcher's poll tries it again
        # one load per route, the others wait for it (setdefault: one lock, even in a race)
        with self._locks.setdefault(route, threading.Lock()):
            now = self._loaded.get(route)
            state = routes.state(self.store, route.gallery, route.name)
            if self._current(now, state, again):
                return now
            try:
                serving = routes.serving(self.store, route.gallery, route.name)
            except StoreError as error:  # revoked, retired, or no grant (yet)
                self._drop(route, str(error), state)
                return None
            if (
                now is not None
                and (now.version, now.model) == (serving.gallery_version, serving.model_version)
                and not (again and now.index_moved(self.store))
            ):
                now = dataclasses.replace(now, state=state)  # e.g. a promote rolled back
            else:
                try:
                    now = load(self.store, serving, state, on_free=self.metrics.freed_index)
                except StoreError as error:
                    why = f"{route} serves {serving.gallery_version}, which cannot be loaded here"
                    self._broken[route] = (f"{why}: {error}", state)
                    raise UnloadableError(self._broken[route][0]) from None
                self._swap(route, now)
            self._loaded[route] = now
            self._gone.pop(route, None)
            self._broken.pop(route, None)
            self._warned.forget(route)
            return now

    def _current(self, now: Loaded | None, state: tuple, again: bool) -> bool:
        """Whether ``now`` is what the route serves at ``state``, its index pointer read too
        when ``again``."""
        return (
            now is not None and now.state == state and not (again and now.index_moved(self.store))
        )

    def _swap(self, route: Route, new: Loaded) -> None:
        old = self._loaded.get(route)
        if old is not None and (old.version, old.model) == (new.version, new.model):
            logger.info("swap %s: %s, index %s -> %s", route, new.version, old.source, new.source)
        else:
            was = old.version if old is not None else "nothing"
            logger.info("swap %s: %s -> %s (%s)", route, was, new.version, new.source)
        self.metrics.swapped(route, old, new)

    def _drop(self, route: Route, why: str, state: tuple) -> None:
        old = self._loaded.pop(route, None)
        self._gone[route] = (why, state)
        self._broken.pop(route, None)
        self._warned.forget(route)
        if old is not None:
            logger.info("swap %s: %s -> nothing: %s", route, old.version, why)
            self.metrics.swapped(route, old, None)

    def _unknown(self, route: Route) -> str:
        known = set(dict(self._loaded)) | set(dict(self._gone)) | set(dict(self._broken))
        galleries = sorted({r.gallery for r in known})
        gallery, name = route.gallery, route.name
        if gallery not in galleries:
            names = ", ".join(galleries) or "none"
            return f"gallery {gallery!r} is not served: galleries are {names}" + did_you_mean(
                gallery, galleries
            )
        names = sorted(r.name for r in known if (r.gallery, r.kind) == (gallery, route.kind))
        if route.kind == "alias":
            what = f"gallery {gallery!r} has no alias {name!r}: its aliases are "
        else:
            what = f"model {name!r} does not query gallery {gallery!r}: its models are "
        return what + (", ".join(names) or "none") + did_you_mean(name, names)

    def listing(self) -> dict:
        """``{kind: {gallery: {name: {"version", "index", "metric"[, "model"]} |
        {"serves": None, "why"}}}}`` for the kinds ``model`` and ``alias``; a route whose
        records name a version this replica cannot load also has ``"unloadable": why`` (beside
        the version it served before, if any: its checked searches answer 503)."""
        out: dict[str, dict] = {kind: {} for kind in self.kinds}
        # copies: a swap may land meanwhile
        loaded, gone, broken = dict(self._loaded), dict(self._gone), dict(self._broken)
        for route, now in sorted(loaded.items(), key=lambda item: astuple(item[0])):
            described = now.describe() | ({"model": now.model} if route.kind == "alias" else {})
            out[route.kind].setdefault(route.gallery, {})[route.name] = described
        for route, (why, _) in sorted(gone.items(), key=lambda item: astuple(item[0])):
            out[route.kind].setdefault(route.gallery, {})[route.name] = {"serves": None, "why": why}
        for route, (why, _) in sorted(broken.items(), key=lambda item: astuple(item[0])):
            listed = out[route.kind].setdefault(route.gallery, {})
            listed[route.name] = listed.get(route.name, {"serves": None, "why": why})
            listed[route.name]["unloadable"] = why
        return out

    def counts(self) -> dict:
        """``{"pairs", "aliases", "unloadable"}``: the (gallery, model) pairs and the named
        aliases loaded now, and the routes whose records name a version that cannot be loaded
        here (some may still hold the version they served before)."""
        loaded, broken = dict(self._loaded), dict(self._broken)
        kinds = [route.kind for route in loaded]
        return {
            "pairs": kinds.count("model"),
            "aliases": kinds.count("alias"),
            "unloadable": len(broken),
        }

    def ready(self) -> bool:
        """Whether this replica should take traffic: some route answers its searches (loaded
        and loadable), or none is unloadable (a store with nothing to serve answers 404s,
        correctly). False while every route it should serve is unloadable."""
        loaded, broken = dict(self._loaded), dict(self._broken)
        return not broken or any(route not in broken for route in loaded)
