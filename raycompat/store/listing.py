"""A gallery's published versions as rows, each with the models that may query it.

The rows of ``raycompat versions`` and of the upgrade report's "Gallery versions" table:
``{"version", "model_version", "width", "dtype", "rows", "lineage", "created", "queried_by"}``,
oldest first. Reads the version records and the catalog's grants; never writes.
"""

from __future__ import annotations

from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import VersionInfo
from raycompat.store.model_catalog import Catalog, QueryGrant


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
