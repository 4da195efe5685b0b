"""Which query model may search which gallery version: the gate of a named alias.

A pair (gallery version ``v``, query model ``m``) is compatible when the store records that
``m``'s queries are comparable with ``v``'s rows, by one of:

- **own**: ``v``'s model is ``m`` (extracted by it, or moved into its space: ``v3 = h(v1)``);
- **grant**: ``m`` holds a query grant on ``v`` (``store/catalog/models.py``);
- **criterion**: ``m`` holds a ``compatible`` grant on another version ``u`` whose model is
  ``v``'s: the upgrade job scored ``m``'s queries against that model's features, the empirical
  compatibility criterion passed and it published that decision as the grant
  (``decisions.py``, ``cluster/upgrade/actions.py``); ``v`` holds the same model's features.

A ``transformed`` grant says nothing about ``v``'s original model (``m`` passed against
``h(v)``, not ``v``), and the criterion is not taken to be transitive. Anything else is refused
with :func:`refusal`: the standing refusal or failure of ``m``'s upgrade, or what its grant
says instead. Reads the store, never writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from raycompat.errors import ManifestError
from raycompat.store.catalog.decisions import NOT_PUBLISHED, Decisions, standing
from raycompat.store.catalog.models import Catalog, QueryGrant
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import VersionInfo


@dataclass(frozen=True)
class Compatibility:
    """Why ``model`` may search a version: ``relation`` as a grant names it (``extracted``,
    ``compatible`` or ``transformed``) and ``why``, one line."""

    relation: str
    why: str


def _criterion_model(store: GalleryStore, gallery: str, grant: QueryGrant) -> str | None:
    """The model whose features a ``compatible`` grant's model passed the criterion against
    (the granted version's model); None for another relation or a version no longer there."""
    if grant.relation != "compatible":
        return None
    try:
        return store.version(gallery, grant.gallery_version).model_version
    except ManifestError:
        return None


def compatibility(
    store: GalleryStore, gallery: str, info: VersionInfo, model: str
) -> Compatibility | None:
    """Why ``model`` may search ``gallery``/``info.version`` (see the module docstring), or
    None when the store records nothing that allows it. A corrupt grant raises."""
    grant = Catalog(store).grant_of(gallery, model)
    if grant is not None and grant.gallery_version == info.version:
        return Compatibility(grant.relation, f"{model}'s grant ({grant.relation})")
    if info.model_version == model:
        return Compatibility("extracted", f"{info.version} is {model}'s own version")
    if grant is not None and _criterion_model(store, gallery, grant) == info.model_version:
        return Compatibility(
            "compatible",
            f"{model} passed the compatibility criterion against {info.model_version} (its "
            f"compatible grant on {grant.gallery_version})",
        )
    return None


def allowed_versions(store: GalleryStore, gallery: str, model: str) -> list[str]:
    """The published versions of ``gallery`` that ``model`` may search, oldest first."""
    return [
        info.version
        for info in store.versions(gallery)
        if compatibility(store, gallery, info, model) is not None
    ]


def refusal(store: GalleryStore, gallery: str, info: VersionInfo, model: str) -> str:
    """Why ``model`` may not search ``info.version``, one line: the criterion that failed or
    the decision that is missing, and the versions it may search."""
    owner = info.model_version
    grant = Catalog(store).grant_of(gallery, model)
    decision = standing(Decisions(store).attempts(gallery, model))
    if grant is None and decision is not None and decision.outcome in NOT_PUBLISHED:
        why = (
            f"{model}'s upgrade was {decision.outcome} against {decision.against or 'nothing'} "
            f"on {decision.created} ({decision.reason})"
        )
    elif grant is not None and grant.relation == "compatible":
        passed = _criterion_model(store, gallery, grant) or "a version no longer published"
        why = f"{model} passed the compatibility criterion against {passed}, not {owner}"
    elif grant is not None:
        why = (
            f"{model} queries {grant.gallery_version} ({grant.relation}); no published decision "
            f"says its queries are compatible with {owner}'s features"
        )
    else:
        why = f"no published decision says {model}'s queries are compatible with {owner}'s"
    allowed = allowed_versions(store, gallery, model)
    return (
        f"{info.version} holds {owner}'s features and {why}; {model} may search "
        f"{', '.join(allowed) or 'no version'} of {gallery}"
    )
