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

No imports: every layer, the CLI's light startup included, may import this module.
"""

from __future__ import annotations

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
