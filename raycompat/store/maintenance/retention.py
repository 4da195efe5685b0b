"""The store's retention: how old an unlisted file must be before gc may delete it.

Storage cannot refuse a write because a newer lease generation exists, so a writer that passed
its last check can stall (a GC pause, a frozen VM, an S3 retry storm) and then make the write it
was about to make, its version record included. Deletion is therefore fenced by time, as Delta
Lake's VACUUM (retention 7 days, with a check that refuses a shorter one) and Iceberg's
orphan-file removal (an age threshold) fence it:

- gc deletes a file only when no version record and no commit's intent record names it and it
  is older than the store's retention (``gc.py``); nothing, the API included, runs gc with a
  shorter one (:class:`~raycompat.store.maintenance.gc.GcArgumentError`);
- a writer adopts, and commits, only part files younger than the **commit horizon**, half the
  retention (``staging.py``): so what a commit can name is at least half a retention younger
  than anything gc may delete, and a commit's intent record protects its files while it runs.

A published version's files are then lost only if a writer stalls for longer than the retention
between writing its intent record and creating its version record (default 7 days).

The retention is the store's, written once into its marker when the store is created
(``marker.py``; ``GalleryStore(..., retention_s=...)``), so every writer and every gc of the
store agree on it. It must be at least :data:`MIN_LEASES` lease timeouts.
"""

from __future__ import annotations

from raycompat.errors import StoreError, UsageError

DEFAULT_RETENTION_S = 7 * 24 * 3600.0
MIN_LEASES = 4  # the retention is at least this many lease timeouts


class RetentionError(UsageError, StoreError):
    """A retention that is not a number, or shorter than :data:`MIN_LEASES` lease timeouts."""


def check_retention(retention_s: object, lease_timeout_s: float = 0.0) -> float:
    """``retention_s`` as a float; :class:`RetentionError` unless it is a number of seconds
    of at least ``MIN_LEASES`` x ``lease_timeout_s``."""
    if isinstance(retention_s, bool) or not isinstance(retention_s, int | float):
        raise RetentionError(f"retention_s must be a number of seconds, got {retention_s!r}")
    if not retention_s > 0 or retention_s < MIN_LEASES * lease_timeout_s:
        raise RetentionError(
            f"retention_s {retention_s:g} s is shorter than {MIN_LEASES} lease timeouts "
            f"({MIN_LEASES} x {lease_timeout_s:g} s): a stalled writer could outlive it"
        )
    return float(retention_s)


def commit_horizon(retention_s: float) -> float:
    """The oldest a part file may be when a writer adopts or commits it: half the retention."""
    return retention_s / 2
