"""The one way a version becomes visible: one create-if-absent write of its record.

A commit of staged parts (``Staging.commit``) and an adoption of files in place
(``adopt.publish_version``) both end here, so a version appears the same way whatever wrote its
files: the record ``<gallery>/_versions/<version>.json`` is created atomically
(``Backend.create_exclusive``: ``O_EXCL`` locally, ``If-None-Match: *`` on S3) and never
rewritten. Of two writers racing for one version exactly one creates the record; the other gets
``on_existing()``: the staging path raises a conflict, an adoption returns the winner's record
if it is the same adoption (docs/store.md, "Invariants").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from raycompat.io.filesystems import Backend
from raycompat.store.manifest import VersionInfo

logger = logging.getLogger(__name__)


def publish_record(
    backend: Backend, record: str, info: VersionInfo, on_existing: Callable[[], VersionInfo]
) -> VersionInfo:
    """Create ``record`` holding ``info``; if it exists already, return ``on_existing()``.

    Args:
        backend: the store's backend (local or S3).
        record: path of the version record, ``manifest.record_path(gallery_path, version)``.
        info: the version to publish; it is returned as readers will see it (its ``uri``).
        on_existing: called when another writer created the record first; raises or returns
            the record to use.
    """
    info = VersionInfo.from_json(info.to_json(), backend.uri(record))
    try:
        backend.create_exclusive(record, info.to_json())
    except FileExistsError:
        return on_existing()
    logger.info("published %s (%d rows, %d files)", record, info.rows, len(info.files))
    return info
