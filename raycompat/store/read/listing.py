"""A gallery's published versions as rows, each with the models that may query it.

The rows of ``raycompat versions`` and of the upgrade report's "Gallery versions" table:
``{"version", "model_version", "width", "dtype", "rows", "lineage", "created", "queried_by"}``,
oldest first; and of ``raycompat galleries``, one row per gallery (:func:`gallery_summaries`).
Reads the version records and the catalog's grants; never writes.
"""

from __future__ import annotations

from raycompat.store.catalog.models import Catalog, QueryGrant
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import VersionInfo


def gallery_versions(store: GalleryStore, gallery: str) -> list[dict]:
    """Every published version of ``gallery``: model, width, rows, lineage and query models.
    A corrupt version record or grant raises (``raycompat versions`` lists leniently, with
    ``versions_report`` and ``grants_report``, then :func:`version_rows`)."""
    return version_rows(store.versions(gallery), Catalog(store).grants(gallery))


def version_rows(infos: list[VersionInfo], grants: list[QueryGrant]) -> list[dict]:
    """One row per version of ``infos``; ``queried_by``: the models ``grants`` give it to."""
    rows = []
    for info in infos:
        queried_by = [g.model_version for g in grants if g.gallery_version == info.version]
        rows.append(
            {
                "version": info.version,
                "model_version": info.model_version,
                "width": info.width,
                "dtype": info.dtype,
                "rows": info.rows,
                "lineage": info.lineage,
                "created": info.created,
                "queried_by": queried_by,
            }
        )
    return rows


def gallery_summaries(store: GalleryStore) -> tuple[list[dict], list[tuple[str, str]]]:
    """One row per gallery of the store (``raycompat galleries``): ``{"gallery", "versions"
    (count), "newest", "model_version", "rows" (the newest's), "query_models" (model ->
    the version it queries)}``; and ``(uri, error)`` of each record that cannot be read."""
    catalog, rows, corrupt = Catalog(store), [], []
    for gallery in store.galleries():
        infos, bad = store.versions_report(gallery)
        grants, bad_grants = catalog.grants_report(gallery)
        corrupt += bad + bad_grants
        newest = infos[-1] if infos else None
        rows.append(
            {
                "gallery": gallery,
                "versions": len(infos),
                "newest": newest.version if newest else None,
                "model_version": newest.model_version if newest else None,
                "rows": newest.rows if newest else None,
                "query_models": {g.model_version: g.gallery_version for g in grants},
            }
        )
    return rows, corrupt
