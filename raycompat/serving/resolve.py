"""Which version a search reads: what a model serves, or what a named alias points at.

- :func:`served_version`: the version a model searches on a gallery (its newest record in the
  served-version log, else its catalog grant; ``served_log.py``), after checking both names
  exist.
- :func:`aliased_version`: the version and query model a named alias (``prod``) points at
  (``aliases.py``); search that version with that model's queries.

Both read the store and never write it.
"""

from __future__ import annotations

from raycompat.serving.aliases import resolve
from raycompat.serving.served_log import Serving, current
from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog
from raycompat.store.read.lookup import check_gallery, model_record


def served_version(store: GalleryStore, gallery: str, model: str) -> Serving:
    """What ``model`` searches on ``gallery``: its newest served-version record, else its grant.

    Raises:
        NotInStoreError: no such gallery, or ``model`` is not registered (lists the names).
        StoreError: the model holds no grant there, was revoked there or was retired.
    """
    check_gallery(store, gallery)
    model_record(Catalog(store), model)
    return current(store, gallery, model)


def aliased_version(store: GalleryStore, gallery: str, alias: str) -> Serving:
    """What the named alias ``alias`` of ``gallery`` points at: ``gallery_version`` searched
    with the queries of ``model_version`` (``source``: ``"alias prod (change 3)"``).

    Raises:
        NotInStoreError: no such gallery, or no such alias (lists the gallery's aliases).
        StoreError: the alias's model was retired, or revoked on the gallery.
    """
    check_gallery(store, gallery)
    record = resolve(store, gallery, alias)
    source = f"alias {alias} (change {record.seq})"
    return Serving(gallery, record.model_version, record.gallery_version, record.relation, source)
