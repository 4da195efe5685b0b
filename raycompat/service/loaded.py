"""One served (gallery, model) pair, loaded: its version's index, warm, and its query map.

A :class:`Loaded` is immutable. A request takes one at its start and answers wholly from it,
so no answer mixes two versions; a swap replaces the table's reference
(``served.py``), and the old index is freed when the last request holding it lets go (the
``on_free`` callback says when: :func:`weakref.finalize`). It remembers the bytes of the
version's index pointer read just before the load (:meth:`Loaded.index_moved`), so that an
index published after it, a first build or a rebuild, is followed as a promote is.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raycompat.serving.query_images import embed_as
from raycompat.serving.query_inputs import QueryError, checked_vectors, read_query_vectors
from raycompat.serving.served_log import Serving
from raycompat.serving.version_space import adapted, query_adapter
from raycompat.store import GalleryStore

if TYPE_CHECKING:
    from raycompat.serving.labels import StoredLabels

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    """``model`` searching ``version`` of ``gallery`` through ``index``.

    Attributes:
        state: the route's state the serving record was read at (``routes.py``).
        width: the model's query width (vectors of another width are refused).
        adapter: the model's query map into the version's space, or None.
        index: the loaded :class:`~raycompat.index.version_index.VersionIndex`.
        order: ``argsort`` of the index's ids where the index holds the vectors (flat,
            exact): ``ids`` queries are read from memory (:meth:`stored`); else None, and
            they are read from the version's files.
        pointer: the version's index pointer as read just before the load (None: none was
            published): :meth:`index_moved` compares it with the one published now.
        note: why the search is exact (no index published, or an unusable one), else None.
        labels: the version's stored labels, read at the first lookup (gallery handles).
    """

    gallery: str
    model: str
    version: str
    relation: str
    state: tuple
    width: int
    adapter: Any
    index: Any
    order: np.ndarray | None = None
    pointer: bytes | None = None
    note: str | None = None
    labels: StoredLabels | None = None

    @property
    def source(self) -> str:
        return self.index.source

    @property
    def metric(self) -> str:
        return self.index.index.distance.score_label

    def stored(self, store: GalleryStore, ids: list[str]) -> np.ndarray:
        """The stored embeddings of ``ids`` (given as text), in their order: from the index
        when it holds them, else one scan of the version's files (``query.stored_vectors``).

        Raises:
            StoreError: an id no row holds, or not an int of an int64-id version.
        """
        # looked up at each call: tests/service/test_served.py replaces stored_vectors
        from raycompat.serving.stored_rows import no_rows, stored_vectors, typed_ids

        if self.order is None:
            return stored_vectors(store, self.gallery, self.version, ids)
        where = f"{self.gallery}/{self.version}"
        wanted = typed_ids(ids, self.index.ids.dtype != object, where)
        found, missing = self.index.vectors_of(wanted, self.order)
        if missing:
            raise no_rows(where, missing)
        return found

    def queries(
        self,
        store: GalleryStore,
        *,
        vectors: np.ndarray | str | None = None,
        ids: Sequence[str] | None = None,
        images: Sequence[str] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> np.ndarray:
        """``(Q, d)`` queries in the version's space from exactly one source, as
        :func:`~raycompat.serving.query_inputs.query_vectors` makes them, with what was loaded once:
        the rows ``ids`` (:meth:`stored`), or the model's ``vectors`` (an array or a
        ``.npy``/Parquet file, checked against its width) or ``images`` (embedded with it),
        mapped by its query adapter.

        Raises:
            QueryError: not exactly one source, or malformed vectors (the row named).
            StoreError: an id no row holds.
        """
        given = vectors is not None if isinstance(vectors, np.ndarray) else bool(vectors)
        if sum((bool(images), given, bool(ids))) != 1:
            raise QueryError("a search takes vectors, ids or images (one of them)")
        if ids:
            return self.stored(store, list(ids))
        if isinstance(vectors, str):
            queries = read_query_vectors(vectors, self.width)
        elif given:
            queries = checked_vectors(vectors, self.width, "vectors")
        else:
            queries = embed_as(store, self.model, list(images), on_note)
        return queries if self.adapter is None else adapted(self.adapter, queries)

    def index_moved(self, store: GalleryStore) -> bool:
        """Whether the version's index pointer changed since this was loaded: an index was
        built (this searched exactly) or rebuilt. One small read."""
        from raycompat.index.version_index import pointer_bytes

        return pointer_bytes(store, self.gallery, self.version) != self.pointer

    def describe(self) -> dict:
        return {"version": self.version, "index": self.source, "metric": self.metric}


def load(
    store: GalleryStore,
    serving: Serving,
    state: tuple,
    on_free: Callable[[str], None] | None = None,
) -> Loaded:
    """Load and warm what ``serving`` names: the version's published index (else an exact
    in-memory one of a small version, logged) and the model's query map; one search runs
    before it is returned, so the first request pays no first-use cost."""
    from raycompat.index.version_index import open_search_index, pointer_bytes
    from raycompat.serving.labels import StoredLabels
    from raycompat.store.catalog.models import Catalog

    gallery, model, version = serving.gallery, serving.model_version, serving.gallery_version
    pointer = pointer_bytes(store, gallery, version)  # before the load: a later publish shows
    index, exact = open_search_index(store, gallery, version, use_gpu=False)
    if exact:
        logger.info("%s", exact)
    width = Catalog(store).model(model).embed_dim
    adapter = query_adapter(store, gallery, version, model)
    index.hits(np.ones((1, index.info.width), np.float32), 1)  # warm: faiss's first search
    order = np.argsort(index.ids, kind="stable") if index.holds_vectors() else None
    labels = StoredLabels(store, gallery, version)
    loaded = Loaded(
        gallery, model, version, serving.relation, state, width, adapter, index, order,
        pointer, exact, labels,
    )  # fmt: skip
    what = f"{gallery}/{version} ({index.source}) of model {model}"
    weakref.finalize(index, _freed, what, on_free)
    return loaded


def _freed(what: str, on_free: Callable[[str], None] | None) -> None:
    logger.info("freed %s", what)
    if on_free is not None:
        on_free(what)
