"""Versioned embedding-gallery store on local disk or S3 (pyarrow + fsspec; no Ray).

Laid out as table formats are (pyiceberg's ``table/``, ``table/update/``, ``table/maintenance/``):

- the vocabulary every part uses, at the top: :mod:`~raycompat.store.gallery` (``GalleryStore``:
  begin, read, list), :mod:`~raycompat.store.manifest` (``VersionInfo``, the version record and
  the layout), :mod:`~raycompat.store.schema` (the table's columns and the checks every table
  passes on publish and on read), :mod:`~raycompat.store.paths`, :mod:`~raycompat.store.records`
  and :mod:`~raycompat.store.relative` (names, record checks, paths in records);
- :mod:`~raycompat.store.commit`: the commit protocol (leases, staging, part records, the checks
  at commit, the one write that publishes);
- :mod:`~raycompat.store.read`: part files and vector columns read back, listings, lookups,
  status;
- :mod:`~raycompat.store.maintenance`: the store marker, retention, gc, a full disk;
- :mod:`~raycompat.store.catalog`: the models, their query grants, retirements and upgrade
  decisions;
- :mod:`~raycompat.store.formats`: table formats. An existing Parquet, Delta or Iceberg table
  adopted in place (its files pinned by the record), a version exported as a Delta or Iceberg
  table.

The faiss index per version is the store's neighbour, :mod:`raycompat.index.version_index`.
The store's names load at their first use (``from raycompat.store import GalleryStore`` imports
``store/gallery.py`` and pyarrow then): importing a submodule
(``raycompat.store.maintenance.retention``, the CLI's ``--help``) does not import them all. Its
errors are :mod:`raycompat.errors`'.
"""

from raycompat._lazy import lazy_exports
from raycompat.errors import (
    ChangedFileError,
    CorruptFileError,
    CorruptIndexError,
    DuplicateIdError,
    ManifestError,
    MissingIndexError,
    PublishConflictError,
    SchemaError,
    StoreError,
    UnsafePathError,
    VerificationError,
)

__getattr__, __dir__, _LAZY_NAMES = lazy_exports(
    __name__,
    {
        "catalog.models": ("Catalog", "ModelRecord", "QueryGrant"),
        "commit.lease": ("LeaseHeldError", "LeaseLostError", "LeaseOwner"),
        "commit.staging": ("Staging",),
        "gallery": ("GalleryStore",),
        "manifest": ("VersionInfo",),
        "schema": (
            "embedding_schema",
            "embedding_table",
            "validate_schema",
            "validate_table",
            "validate_values",
            "version_metadata",
        ),
    },
)

__all__ = [
    "Catalog",
    "ChangedFileError",
    "CorruptFileError",
    "CorruptIndexError",
    "DuplicateIdError",
    "GalleryStore",
    "LeaseHeldError",
    "LeaseLostError",
    "LeaseOwner",
    "ManifestError",
    "MissingIndexError",
    "ModelRecord",
    "PublishConflictError",
    "QueryGrant",
    "SchemaError",
    "Staging",
    "StoreError",
    "UnsafePathError",
    "VerificationError",
    "VersionInfo",
    "embedding_schema",
    "embedding_table",
    "validate_schema",
    "validate_table",
    "validate_values",
    "version_metadata",
]
