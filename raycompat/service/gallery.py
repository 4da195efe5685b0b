"""A gallery handle for Python programs: a gallery searched as a model (or through a named
alias) from an index loaded once, following the store as a service replica does.

    with open_gallery(store, "mnist", model="m1") as gallery:
        result = gallery.search(vectors=queries, k=10)    # a SearchResult, as search()'s

A :class:`Gallery` is one route of a :class:`~raycompat.service.served.Served` (a model, or
a named alias: ``routes.py``), so it loads, follows and swaps with the service's own code. At
open it loads and warms the version the route serves (its published index, else an exact
in-memory one of a small version); each search answers from that snapshot, and a watcher
thread (``watcher.py``) polls the route every ``poll_s`` seconds, as the service's does: a
promote, a rollback, an alias set, a revoke or a retire, and an index built or rebuilt for the
version served, each load beside the current snapshot and swap in; a search that took the old
one finishes on it. ``check_each_search`` also checks the route's records before every search
(the service's ``check_each_request``: a listing and a stat, so no answer comes from a version
the records stopped serving); off by default, as it costs more than a search of a small
index. :meth:`Gallery.refresh` follows at once.

A search answers what :func:`raycompat.serving.search` answers for the same queries (the same
ranking, ``ranked_hits``; labels from :class:`~raycompat.serving.labels.StoredLabels`: the hits'
rows only, the label column's presence read once)
and prints nothing. Errors are one line naming the gallery and the model or alias.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from raycompat.errors import RaycompatError, UsageError
from raycompat.service.config import ServiceConfig
from raycompat.service.loaded import Loaded
from raycompat.service.requests import check_alias_model
from raycompat.service.routes import Route
from raycompat.service.served import Served
from raycompat.service.watcher import Watcher
from raycompat.serving.query_inputs import QueryError, check_k
from raycompat.serving.query_path import QueryHits, SearchResult
from raycompat.serving.ranking import ranked_hits
from raycompat.serving.resolve import aliased_version, served_version
from raycompat.store import GalleryStore

POLL_S = ServiceConfig.poll_s  # the service's watcher's period, one home for both


class GalleryClosedError(UsageError, RuntimeError):
    """A search of a gallery handle after :meth:`Gallery.close`."""


class Gallery:
    """``route`` of ``store``, loaded and followed; see the module docstring. Made by
    :func:`open_gallery`."""

    def __init__(
        self,
        store: GalleryStore,
        route: Route,
        model: str | None = None,
        poll_s: float | None = POLL_S,
        check_each_search: bool = False,
    ) -> None:
        self.store, self.route, self.check_each_search = store, route, check_each_search
        self._model = model  # asked with an alias: the model whose vectors are searched
        self._served: Served | None = Served(store)
        self._served.follow(self.route)  # UnloadableError: the route and why
        self._served.for_request(self.route, check=False)  # NotServedError: why
        self._watcher = None
        if poll_s is not None:
            self._watcher = Watcher(_weak_poll(self), poll_s)
            weakref.finalize(self, self._watcher.stop)
            self._watcher.start()

    def __repr__(self) -> str:
        try:
            now = self.describe()
        except RaycompatError as error:  # closed, revoked, unloadable: say so, never raise
            return f"Gallery({self.route}: {error})"
        return f"Gallery({self.route}: {now['version']}, {now['index']})"

    def __enter__(self) -> Gallery:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def loaded(self) -> Loaded:
        """The snapshot a search answers from now (the route's records checked first when
        ``check_each_search``).

        Raises:
            GalleryClosedError: the handle was closed.
            NotServedError: the route serves nothing now (revoked, retired: why).
            UnloadableError: its records name a version that cannot be loaded here (why).
        """
        served = self._served
        if served is None:
            raise GalleryClosedError(f"gallery handle {self.route} is closed")
        loaded = served.for_request(self.route, self.check_each_search)
        alias = self.route.name if self.route.kind == "alias" else None
        check_alias_model(alias, self._model, loaded)
        return loaded

    def describe(self) -> dict:
        """What answers now: ``{"gallery", "model", ["alias",] "version", "index",
        "metric"}``; ``index`` is ``build <id>`` or ``exact``."""
        loaded = self.loaded()
        alias = {"alias": self.route.name} if self.route.kind == "alias" else {}
        return {"gallery": loaded.gallery, "model": loaded.model, **alias, **loaded.describe()}

    def search(
        self,
        *,
        vectors: np.ndarray | str | None = None,
        ids: Sequence[str] | None = None,
        images: Sequence[str] | None = None,
        k: int = 5,
        nprobe: int | None = None,
        names: Sequence[Any] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> SearchResult:
        """The top-``k`` hits of each query, from the snapshot loaded now; the arguments and
        the answer are :func:`raycompat.serving.search`'s (``vectors``: the model's ``(Q, d)``
        queries, an array or a ``.npy``/Parquet file; ``ids``: rows stored in the version;
        ``images``: embedded with the model; exactly one of them).

        Raises:
            QueryError: not exactly one source, ``k < 1``, or malformed vectors.
            ZeroNormError: a zero query on a cosine version.
            StoreError: an id no row holds; and as :meth:`loaded`.
        """
        check_k(k)
        loaded = self.loaded()
        queries = loaded.queries(
            self.store, vectors=vectors, ids=ids, images=images, on_note=on_note
        )
        if names is None and isinstance(vectors, str):
            names = [f"{vectors}[{q}]" for q in range(len(queries))]
        hits, short = ranked_hits(loaded.index, queries, k, nprobe, names, loaded.model)
        notes = [note for note in (loaded.note, short) if note]
        for note in notes if on_note is not None else ():
            on_note(note)
        labels = loaded.labels.of([found for _, found in hits])
        found = [QueryHits(i, s, row) for (s, i), row in zip(hits, labels, strict=True)]
        return SearchResult(
            loaded.gallery, loaded.version, found, notes, loaded.source, loaded.metric, loaded.model
        )

    def refresh(self) -> None:
        """Follow the route's records and its version's index now (what each poll does)."""
        served = self._served
        if served is None:
            raise GalleryClosedError(f"gallery handle {self.route} is closed")
        served.poll(self.route)

    def close(self) -> None:
        """Stop following and let the index go (freed when no search holds it); searches
        raise :class:`GalleryClosedError` from now on. Closing twice is a no-op."""
        if self._watcher is not None:
            self._watcher.stop()
        self._served = None


def _weak_poll(gallery: Gallery) -> Callable[[], None]:
    """The watcher's poll of ``gallery``, holding it weakly: a handle dropped unclosed is
    collected, and its finalizer stops the watcher."""
    ref = weakref.ref(gallery)

    def poll() -> None:
        handle = ref()
        if handle is not None and handle._served is not None:
            handle.refresh()

    return poll


def open_gallery(
    store: GalleryStore,
    gallery: str,
    *,
    model: str | None = None,
    alias: str | None = None,
    poll_s: float | None = POLL_S,
    check_each_search: bool = False,
) -> Gallery:
    """A :class:`Gallery` of ``gallery`` as ``model`` (the version it serves: its newest
    alias-log record, else its grant), or through the named alias ``alias`` (the version and
    query model it points at; with ``model`` too, a search is refused once the alias points at
    another model, whose space the model's vectors are not in). Loaded and warmed before it
    returns.

    Args:
        poll_s: seconds between two looks at the route's records and index pointer (a watcher
            thread); None: no thread, :meth:`Gallery.refresh` follows.
        check_each_search: check the route's records before each search too (a promote or
            revoke is followed from the next search; a listing and a stat each).
    Raises:
        QueryError: neither ``model`` nor ``alias``.
        NotInStoreError: no such gallery, model or alias (the valid names listed).
        StoreError: the model serves nothing there (no grant, revoked, retired: why).
        UnloadableError: what it serves cannot be loaded (the route, the version and why).
    """
    from raycompat.store.catalog.models import Catalog
    from raycompat.store.read.lookup import model_record

    if alias is None:
        if model is None:
            raise QueryError(f"open_gallery({gallery!r}) needs model= or alias=")
        served_version(store, gallery, model)  # unknown names listed; why nothing is served
        route = Route(gallery, model)
    else:
        aliased_version(store, gallery, alias)
        if model is not None:
            model_record(Catalog(store), model)
        route = Route(gallery, alias, "alias")
    return Gallery(store, route, model if alias is not None else None, poll_s, check_each_search)
