"""Errors raised by :mod:`raycompat.store`.

Every error is a :class:`StoreError` (a ``ValueError``) whose message names the file, manifest
record or argument at fault and, for per-row problems, the row. A store error is a
:class:`~raycompat.errors.DataError` (exit 1), except one the user fixes, such as
:class:`MissingStoreError`, which is also a :class:`~raycompat.errors.UsageError` (exit 2).
"""

from __future__ import annotations

from raycompat.errors import DataError, UsageError


class StoreError(DataError, ValueError):
    """Base class of every store error."""


class UnsafePathError(StoreError):
    """A gallery/version/file name or a manifest path could escape the store prefix."""


class SchemaError(StoreError):
    """A table lacks a column, has the wrong type or width, or holds NaN/inf/null vectors."""


class DuplicateIdError(StoreError):
    """The same ``id`` appears twice in one version (within or across part files)."""


class CorruptFileError(StoreError):
    """A Parquet part file or a manifest record cannot be parsed."""


class CorruptIndexError(CorruptFileError):
    """A version index's pointer or files fail their checksum, size or parse, or disagree with
    the version; rebuild the index (derived data) from the version."""


class PublishConflictError(StoreError):
    """The version is already published (another publisher won the race)."""


class NotInStoreError(StoreError):
    """A gallery, model or version name the store does not hold; the message lists the names it
    does hold and the nearest (``raycompat.store.lookup``). Exit 1, as these lookups always were
    (``versions`` of an unknown gallery, ``search`` with an unregistered model)."""


class ManifestError(StoreError):
    """A version record is missing, or disagrees with the files it lists."""


class ChangedFileError(ManifestError):
    """An external file of an adopted version changed (size, ETag or mtime) or vanished since
    the version pinned it; the version no longer describes it."""


class MissingIndexError(ManifestError):
    """The version exists but no index was built for it yet."""


class VerificationError(StoreError):
    """The staged rows or ids differ from what the publisher expected."""


class MissingStoreError(UsageError, StoreError):
    """There is no store at the root (a mistyped path): readers refuse it rather than list
    nothing."""
