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
"""

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
from raycompat.store.gallery import GalleryStore
from raycompat.store.lease import LeaseHeldError, LeaseLostError, LeaseOwner
from raycompat.store.manifest import VersionInfo
from raycompat.store.model_catalog import Catalog, ModelRecord, QueryGrant
from raycompat.store.schema import embedding_schema, embedding_table, version_metadata
from raycompat.store.staging import Staging
from raycompat.store.validate import validate_schema, validate_table, validate_values

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
