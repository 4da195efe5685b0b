"""Query access to a version a transform job wrote (``jobs/transform.py``).

The upgrade job registers a model and grants it each version it writes
(``cluster/upgrade/steps.py: publish_model``); the transform job writes a version for the model
its config names (``target.model_version``), and without a grant nothing could search the
version as that model (``raycompat search G --model M``: "not registered"). So once the version
is published (or found published by a rerun), :func:`grant_written` registers the model if it
is new and grants it the version, each create-if-absent as everywhere in the catalog:

- ``extract``: the model's files are copied into the store beside its record, so ``search``
  embeds query images with it;
- ``transform``: the job holds ``h``, not the new model's weights: the model is registered
  without weights, as ``raycompat adopt`` registers one, and queries with vectors;
- a model already registered keeps its record (its width must be the version's).

A model that already queries another version of the gallery keeps that grant (grants are
immutable), as does a retired one (it takes none): the version stays searchable with
``raycompat search G --version V``, and the returned line says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from raycompat.store.catalog.models import Catalog, CatalogConflictError, ModelRecord, QueryGrant
from raycompat.store.catalog.retired import RetiredModelError
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import VersionInfo

REASON = "written by the transform job"


def grant_written(
    store: GalleryStore,
    gallery: str,
    info: VersionInfo,
    relation: str,
    model_dir: str | None = None,
    files: Sequence[str] = (),
) -> str:
    """Register ``info.model_version`` (if new: with ``files`` of the local ``model_dir``
    copied in, else without weights) and grant it ``gallery``/``info.version`` as
    ``relation`` (``extracted`` or ``transformed``). Returns one line for the log.

    Raises:
        SchemaError: the model is registered with another width than the version's.
    """
    catalog, model, version = Catalog(store), info.model_version, info.version
    new = ModelRecord(model, "", info.width, method="external")
    record = catalog.registered_or(new, f"{gallery}/{version}")
    if record is new and model_dir is not None:
        record.uri = catalog.put_model_files(model, model_dir, list(files))
    catalog.register_model(record)
    try:
        catalog.grant(QueryGrant(gallery, version, model, relation, {"reason": REASON}))
    except CatalogConflictError:  # grants are immutable: the earlier one stands
        why = f"it queries {catalog.queryable_version(gallery, model).gallery_version}"
    except RetiredModelError:
        why = "it is retired"
    else:
        weights = "" if record.has_weights else ", without weights: it queries with vectors"
        return f"model {model} queries {gallery} {version} ({relation}{weights})"
    return (
        f"model {model} is not granted {gallery} {version} ({why}); search the version with "
        f"raycompat search {gallery} --version {version}"
    )
