"""One served (gallery, model) pair, loaded: its version's index, warm, and its query map.

A :class:`Loaded` is immutable. A request takes one at its start and answers wholly from it,
so no answer mixes two versions; a swap replaces the table's reference
(``served.py``), and the old index is freed when the last request holding it lets go (the
``on_free`` callback says when: :func:`weakref.finalize`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from raycompat.store import GalleryStore
from raycompat.store.aliases import Serving

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
        from raycompat.index.query import no_rows, stored_vectors, typed_ids

        if self.order is None:
            return stored_vectors(store, self.gallery, self.version, ids)
        where = f"{self.gallery}/{self.version}"
        wanted = typed_ids(ids, self.index.ids.dtype != object, where)
        found, missing = self.index.vectors_of(wanted, self.order)
        if missing:
            raise no_rows(where, missing)
        return found

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
    from raycompat.index.query import query_adapter
    from raycompat.index.version_index import open_search_index
    from raycompat.store.model_catalog import Catalog

    gallery, model, version = serving.gallery, serving.model_version, serving.gallery_version
    index, exact = open_search_index(store, gallery, version, use_gpu=False)
    if exact:
        logger.info("%s", exact)
    width = Catalog(store).model(model).embed_dim
    adapter = query_adapter(store, gallery, version, model)
    index.hits(np.ones((1, index.info.width), np.float32), 1)  # warm: faiss's first search
    order = np.argsort(index.ids, kind="stable") if index.holds_vectors() else None
    loaded = Loaded(gallery, model, version, serving.relation, state, width, adapter, index, order)
    what = f"{gallery}/{version} ({index.source}) of model {model}"
    weakref.finalize(index, _freed, what, on_free)
    return loaded


def _freed(what: str, on_free: Callable[[str], None] | None) -> None:
    logger.info("freed %s", what)
    if on_free is not None:
        on_free(what)
