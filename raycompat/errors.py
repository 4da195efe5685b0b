"""The two kinds of error raycompat raises on purpose, and the exit status each one means.

Every error class defined under ``raycompat/`` is a :class:`UsageError` or a :class:`DataError`
(``tests/test_errors.py`` walks the package to check it), and keeps the built-in base it had
(``ConfigError`` is still a ``ValueError``, ``UnknownNameError`` a ``KeyError``), so every
``except`` written before the hierarchy still catches what it caught::

    RaycompatError
      UsageError   exit 2: the user's input is wrong (ConfigError, UnknownNameError, QueryError,
                   MissingStoreError, GcArgumentError, AdoptOptionError, ExportOptionError)
      DataError    exit 1: stored or input data is bad, or a run failed on it (StoreError and
                   its family, CorruptDataError, WeightsMismatchError, UnknownKindError,
                   NonFiniteError, ZeroNormError, PipelineError)

A store error the user fixes (``MissingStoreError``: a mistyped ``--store``) is both a
``StoreError``, as callers catch it, and a ``UsageError``; the usage category wins. The
``raycompat`` command and the jobs' ``run_main`` print either as one line with its exit status
(``raycompat/cli/errors.py``); any other exception is a bug and keeps its traceback.

Every error class the layers share lives here, below all of them (the store's, the config's):
no imports, so every layer, ``raycompat.io`` and the CLI's light startup included, may import
this module without a cycle.
"""

from __future__ import annotations

__all__ = [
    "ChangedFileError",
    "ConfigError",
    "CorruptFileError",
    "CorruptIndexError",
    "DataError",
    "DuplicateIdError",
    "ManifestError",
    "MissingIndexError",
    "MissingStoreError",
    "NotInStoreError",
    "PublishConflictError",
    "RaycompatError",
    "SchemaError",
    "StoreError",
    "UnsafePathError",
    "UsageError",
    "VerificationError",
    "exit_status",
]

USAGE_EXIT = 2
DATA_EXIT = 1


class RaycompatError(Exception):
    """Base of every error raycompat raises on purpose; its message names what to fix. Raise a
    :class:`UsageError` or a :class:`DataError`, never this class itself."""


class UsageError(RaycompatError):
    """The user's input is wrong: a config key or value, an unknown registered name, a store,
    gallery or model that is not there, a bad command-line argument. Exit status 2."""


class DataError(RaycompatError):
    """Stored or input data is bad (a corrupt record or file, weights that do not fit, NaN/inf),
    or a run failed on it (a diverged step, a failed pipeline chunk). Exit status 1."""


def exit_status(error: BaseException) -> int:
    """2 for a :class:`UsageError` (also one that is a ``DataError`` too), else 1."""
    return USAGE_EXIT if isinstance(error, UsageError) else DATA_EXIT


class ConfigError(UsageError, ValueError):
    """A config key is unknown, missing or of the wrong type; the message names the key."""


# The store's errors (raycompat.store). Every one is a StoreError (a ValueError) whose message
# names the file, manifest record or argument at fault and, for per-row problems, the row; one
# the user fixes, such as MissingStoreError, is also a UsageError (exit 2).
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
    does hold and the nearest (``raycompat.store.read.lookup``). Exit 1, as these lookups always
    were (``versions`` of an unknown gallery, ``search`` with an unregistered model)."""


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
