"""One upgrade job per gallery at a time: the job lease.

Two upgrade jobs writing the same gallery at once race on everything the history writes
(training checkpoints, staging areas, decision records). So ``jobs/upgrade.py`` takes a lease
before Ray starts and holds it, heartbeating, until the job ends, and releases it also when
the job fails::

    <root>/_jobs/upgrade-<gallery>/_lease/00000001.json

It is the store's staging lease (``raycompat/store/commit/lease.py``: create-if-absent generations,
heartbeats, takeover once the holder is dead or silent for ``timeout_s``), kept under a
``_``-prefixed folder of the store root that no gallery listing or gc reads. It is keyed by
the gallery, not the history's ``name``: two histories that write one gallery would race on its
versions and decisions just the same.

    with upgrade_lease(store, "mnist", timeout_s=120) as lease:
        ...   # UpgradeRunningError at once if a live job holds it, naming it
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from raycompat.errors import StoreError
from raycompat.store.commit.lease import (
    DEFAULT_TIMEOUT_S,
    LEASE_DIR,
    Lease,
    LeaseHeldError,
    read_newest,
)
from raycompat.store.gallery import GalleryStore
from raycompat.store.paths import check_name, join

JOBS_DIR = "_jobs"


class UpgradeRunningError(StoreError):
    """Another live upgrade job holds the gallery's job lease."""


def lease_dir(store: GalleryStore, gallery: str) -> str:
    """Where the upgrade job lease of ``gallery`` lives."""
    name = f"upgrade-{check_name('gallery', gallery)}"
    return join(store.backend.root, JOBS_DIR, name, LEASE_DIR)


@contextmanager
def upgrade_lease(
    store: GalleryStore, gallery: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Iterator[Lease]:
    """Hold the gallery's upgrade job lease for the ``with`` block; released when it ends,
    normally or by an exception.

    Raises:
        UpgradeRunningError: a live job holds it; the message names it (job, host, pid, last
            heartbeat).
    """
    path = lease_dir(store, gallery)
    try:
        lease = Lease.acquire(store.backend, path, timeout_s)
    except LeaseHeldError as error:
        raise UpgradeRunningError(_running(store, gallery, path, error)) from None
    try:
        yield lease
    finally:
        lease.release()


def _running(store: GalleryStore, gallery: str, path: str, error: LeaseHeldError) -> str:
    """One line naming the live job (job, host, pid, last heartbeat) and what to do."""
    try:
        holder = read_newest(store.backend, path)
    except StoreError:
        holder = None
    if holder is None:  # released between the two reads: the lease's own words
        return f"gallery {gallery!r}: another upgrade job holds its job lease ({error})"
    return (
        f"gallery {gallery!r} is being upgraded by {holder.describe()} "
        f"(lease {store.backend.uri(path)}); this job does not start. Wait for that job, or "
        f"rerun once its heartbeat is older than the timeout"
    )
