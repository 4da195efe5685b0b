"""What a search names: a model (``"model": "m2"``) or a named alias (``"alias": "prod"``) of a
gallery, and how the service follows each through the store's records.

A kind of route says three things (``ROUTES``, a registry):

- ``names(store, gallery)``: the routes of the gallery (models that query it; its aliases);
- ``serving(store, gallery, name)``: what the route serves now, a
  :class:`~raycompat.serving.served_log.Serving`, or a ``StoreError`` saying why it serves nothing;
- ``state(store, gallery, name)``: a cheap fingerprint of the records ``serving`` reads
  (listings and stats, at most one small record read): the logs are append-only, so an equal
  fingerprint means the same answer, and the service checks it before each search.

A model's state is its served-version log's length on the gallery and whether it has a retired
tombstone. An alias's is its own log's length plus the state of the model its newest record
names (a revoke or retire of that model stops the alias too, ``serving/aliases.py: resolve``); that
model is read once per log length and remembered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raycompat.serving import aliases
from raycompat.serving.served_log import Serving, changes, current
from raycompat.serving.serving_map import query_models
from raycompat.store import GalleryStore
from raycompat.store.catalog.retired import retired


@dataclass(frozen=True)
class Route:
    """``name`` of ``gallery``, a model or an alias (``kind``)."""

    gallery: str
    name: str
    kind: str = "model"

    def __str__(self) -> str:
        return f"{self.gallery}/{self.name}" + (" (alias)" if self.kind == "alias" else "")


def model_state(store: GalleryStore, gallery: str, model: str) -> tuple:
    return changes(store, gallery, model), retired(store, model) is not None


class ModelRoutes:
    """A model that queries the gallery serves what its alias log, else its grant, says."""

    def names(self, store: GalleryStore, gallery: str) -> list[str]:
        return query_models(store, gallery)

    def serving(self, store: GalleryStore, gallery: str, name: str) -> Serving:
        return current(store, gallery, name)

    def state(self, store: GalleryStore, gallery: str, name: str) -> tuple:
        return model_state(store, gallery, name)


@dataclass
class AliasRoutes:
    """A named alias serves the (version, model) pair its newest record points at."""

    _model_at: dict = field(default_factory=dict)  # (gallery, alias) -> (log length, model)

    def names(self, store: GalleryStore, gallery: str) -> list[str]:
        return aliases.names(store, gallery)

    def serving(self, store: GalleryStore, gallery: str, name: str) -> Serving:
        from raycompat.serving.resolve import aliased_version

        return aliased_version(store, gallery, name)

    def state(self, store: GalleryStore, gallery: str, name: str) -> tuple:
        count = aliases.changes(store, gallery, name)
        if not count:
            return (0,)
        seen, model = self._model_at.get((gallery, name), (None, None))
        if seen != count:
            model = aliases.log(store, gallery, name)[-1].model_version
            self._model_at[(gallery, name)] = (count, model)
        return count, *model_state(store, gallery, model)


ROUTES = {"model": ModelRoutes, "alias": AliasRoutes}
