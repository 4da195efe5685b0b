"""A model's queries in the version's space: through its query adapter, or as they are.

A model whose grant is ``adapted`` to a version (a training-free upgrade,
``query_adapters.py``: nothing in the gallery was rewritten) has its queries mapped into the
version's space before the search, by the map :func:`query_adapter` builds to run beside faiss
(``index/query_map.py``). Any other model's queries are searched as they are (a compatible
model's are cut or padded at search time, ``ranking.to_width``).
"""

from __future__ import annotations

import numpy as np

from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog


def to_version_space(
    store: GalleryStore, gallery: str, version: str, model: str, queries: np.ndarray
) -> np.ndarray:
    """``(Q, d_version)``: ``model``'s ``queries (Q, d)`` mapped by the model's query adapter
    when its grant is ``adapted`` to ``version``, else ``queries`` as they are."""
    adapter = query_adapter(store, gallery, version, model)
    return queries if adapter is None else adapted(adapter, queries)


def query_adapter(store: GalleryStore, gallery: str, version: str, model: str):
    """The map ``model``'s queries go through to search ``version`` (its grant is ``adapted``
    to that version), loaded once and built to run beside faiss (``search_map``); None when
    they are searched as they are."""
    from raycompat.index.query_map import search_map
    from raycompat.serving.query_adapters import ADAPTED, load_adapter

    grant = Catalog(store).grant_of(gallery, model)  # none: --version searches regardless
    if grant is None or grant.relation != ADAPTED or grant.gallery_version != version:
        return None
    return search_map(load_adapter(store, grant))


def adapted(adapter, queries: np.ndarray) -> np.ndarray:
    """``(Q, d_version)``: ``queries`` mapped by a :func:`query_adapter` (its ``map_arrays``)."""
    return adapter.map_arrays(queries)
