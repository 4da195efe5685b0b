"""Versioned embedding-gallery store on local disk or S3 (pyarrow + fsspec; no Ray).

- :mod:`~raycompat.store.schema`: table schema and validation.
- :mod:`~raycompat.store.manifest`: version records and the publishing protocol (why it is safe).
- :mod:`~raycompat.store.staging` / :mod:`~raycompat.store.gallery`: write, publish, read.
- :mod:`~raycompat.store.lease` / :mod:`~raycompat.store.part_record`: one writer per staging
  area, and what each writer says it wrote (checked at commit).
- :mod:`~raycompat.store.model_catalog`: the models and the versions each one may query.
- :mod:`~raycompat.index.version_index`: a faiss index per version, and queries that return ids.
- :mod:`~raycompat.store.formats`: table formats. An existing Parquet, Delta or Iceberg table
  adopted in place (its files pinned by the record), a version exported as a Delta or Iceberg
  table.

The store's names load at their first use (``from raycompat.store import GalleryStore`` imports
``store/gallery.py`` and pyarrow then): importing a submodule (``raycompat.store.retention``,
the CLI's ``--help``) does not import them all. Its errors are :mod:`raycompat.errors`'.
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
        "gallery": ("GalleryStore",),
        "lease": ("LeaseHeldError", "LeaseLostError", "LeaseOwner"),
        "manifest": ("VersionInfo",),
        "model_catalog": ("Catalog", "ModelRecord", "QueryGrant"),
        "schema": ("embedding_schema", "embedding_table", "version_metadata"),
        "staging": ("Staging",),
        "validate": ("validate_schema", "validate_table", "validate_values"),
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
