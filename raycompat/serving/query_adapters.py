"""Query-side adapters: a model searches an older gallery version through a fitted map.

A training-free upgrade (issue 41, docs/transformations.md) need not rewrite the gallery: the
new model's query embedding is mapped into the version's space at query time. The map (a
``procrustes``, ``affine`` or ``adapter`` transformation, fitted on pairs of the new model's
and the version's embeddings of the same items) is kept in the store, beside the version::

    <root>/<gallery>/_adapters/<model>/<version>/<digest>/h.json, h.safetensors

written once, create-if-absent, in a folder named by the first 16 hex digits of the sha256 of
both files, so another fit never overwrites one. The model's query grant on the gallery
(``relation: "adapted"``) names the folder and each file's sha256; :func:`load_adapter` checks
them before building the map. gc never collects ``_adapters`` (``store/maintenance/gc.py``), and
a version a grant names is kept as any served version is (``serving_map.serving_map``).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from raycompat.errors import CorruptFileError, StoreError, UsageError
from raycompat.store.catalog.models import Catalog, QueryGrant
from raycompat.store.gallery import GalleryStore
from raycompat.store.paths import check_name, join
from raycompat.store.read.lookup import model_record, version_record

if TYPE_CHECKING:
    from raycompat.transformations import Fit, Transformation

ADAPTERS_DIR = "_adapters"
ADAPTED = "adapted"
FILES = ("h.json", "h.safetensors")


class AdapterWidthError(UsageError, StoreError):
    """The map does not take the model's width to the version's: exit 2, nothing written."""


def _folder(gallery: str, model: str, version: str, digest: str) -> str:
    """The adapter's folder, relative to the gallery."""
    names = (check_name("model", model), check_name("version", version))
    return "/".join((ADAPTERS_DIR, *names, digest))


def _files_of(fit: Fit) -> dict[str, bytes]:
    """``h.json`` and ``h.safetensors`` of the fitted map, as ``save_transformation`` writes
    them (the fit's pairs and residual recorded in ``h.json``)."""
    from raycompat.transformations import save_transformation

    with tempfile.TemporaryDirectory() as local:
        save_transformation(local, fit.transformation, "h", **fit.info())
        return {name: (Path(local) / name).read_bytes() for name in FILES}


def publish_adapter(
    store: GalleryStore,
    gallery: str,
    version: str,
    model: str,
    fit: Fit,
    evidence: dict | None = None,
) -> QueryGrant:
    """Store ``fit``'s map and grant ``model`` the version through it, the grant's evidence
    naming the map (and holding ``evidence``, e.g. the upgrade job's reason and scores); a
    rerun with the same fit is a no-op that returns the same grant.

    Raises:
        NotInStoreError: no such gallery, version or registered model (lists the names).
        AdapterWidthError: the map does not take the model's width to the version's.
        StoreError: the model already queries the gallery otherwise (its grant is kept), or was
            retired.
    """
    info = version_record(store, gallery, version)
    catalog = Catalog(store)
    width = model_record(catalog, model).embed_dim
    h = fit.transformation
    if (h.d_old, h.d_new) != (width, info.width):
        raise AdapterWidthError(
            f"the fitted map takes {h.d_old}-d to {h.d_new}-d, but model {model} embeds to "
            f"{width}-d and {gallery}/{version} holds {info.width}-d rows"
        )
    files = _files_of(fit)
    digest = hashlib.sha256(b"".join(files[name] for name in FILES)).hexdigest()[:16]
    folder = _folder(gallery, model, version, digest)
    held = catalog.grant_of(gallery, model)
    if held is not None:
        if held.relation == ADAPTED and held.evidence.get("adapter") == folder:
            return held  # this fit was granted before (a rerun)
        raise StoreError(
            f"model {model} already queries {gallery} at {held.gallery_version} ({held.relation}"
            f"{', another fit' if held.relation == ADAPTED else ''}); a grant is never "
            f"rewritten: register the new model under another name to adapt it again"
        )
    store.mark()  # gc manages only marked stores (marker.py)
    for name, data in files.items():
        path = store.path(gallery, join(folder, name))
        try:
            store.backend.create_exclusive(path, data)
        except FileExistsError:  # this fit was stored before (a rerun): the same bytes
            with store.filesystem.open_input_stream(path) as stream:
                if stream.read() != data:
                    raise CorruptFileError(
                        f"{store.backend.uri(path)}: holds other bytes than this fit's"
                    ) from None
    spec = json.loads(files["h.json"])
    evidence = {
        **(evidence or {}),
        "adapter": folder,
        "kind": spec["kind"],
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
        **{k: spec["fit"][k] for k in ("pairs", "residual", "relative_residual")},
    }
    return catalog.grant(QueryGrant(gallery, version, model, ADAPTED, evidence))


def load_adapter(store: GalleryStore, grant: QueryGrant) -> Transformation:
    """The map an ``adapted`` grant names, each file's sha256 checked (a mismatch or a missing
    file is ``CorruptFileError`` naming it), in eval mode on the CPU."""
    from raycompat.transformations.files import TransformationFiles, stored_spec

    folder, data = grant.evidence["adapter"], {}
    for name in FILES:
        path = store.path(grant.gallery, join(folder, name))
        source = store.backend.uri(path)
        try:
            with store.filesystem.open_input_stream(path) as stream:
                data[name] = stream.read()
        except FileNotFoundError:
            raise CorruptFileError(f"{source}: the query adapter's file is missing") from None
        if hashlib.sha256(data[name]).hexdigest() != grant.evidence["sha256"][name]:
            raise CorruptFileError(f"{source}: checksum mismatch with its query grant")
    location = store.uri(grant.gallery, folder)
    spec = stored_spec(json.loads(data["h.json"]), f"{location}/h.json")
    return TransformationFiles("h", location, spec, data["h.safetensors"]).build()
