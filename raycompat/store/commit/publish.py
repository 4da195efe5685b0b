"""The one way a version becomes visible: one create-if-absent write of its record.

A commit of staged parts (``Staging.commit``) and an adoption of files in place
(``adopt.publish_version``) both end here, so a version appears the same way whatever wrote its
files: the record ``<gallery>/_versions/<version>.json`` is created atomically
(``Backend.create_exclusive``: ``O_EXCL`` locally, ``If-None-Match: *`` on S3) and never
rewritten. Of two writers racing for one version exactly one creates the record; the other gets
``on_existing()``: the staging path raises a conflict, an adoption returns the winner's record
if it is the same adoption (docs/store.md, "Invariants").

The record says who published it (``by``: the
:class:`~raycompat.store.commit.lease.LeaseOwner` of the writer's lease, its Ray submission id
and OS user) and, as Delta's ``DESCRIBE HISTORY`` does, the operation that made it and that
operation's parameters (:func:`with_operation`), which ``raycompat history`` shows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from raycompat.io.credentials import REDACTED, is_secret_key, scrub
from raycompat.io.filesystems import Backend
from raycompat.store.commit.lease import LeaseOwner
from raycompat.store.manifest import VersionInfo
from raycompat.store.paths import check_name

logger = logging.getLogger(__name__)
MAX_PARAMETER_CHARS = 200  # a longer value (a long list of paths) is cut: the record stays small
MAX_PARAMETER_ITEMS = 20


def with_operation(info: VersionInfo, kind: str, **parameters: Any) -> VersionInfo:
    """``info`` recording the operation ``kind`` that makes it and its ``parameters``.

    A pipeline passes its plan's identity (``with_operation(info, **identity)``: ``kind`` and
    what a rerun must match). Parameters are kept small and safe: a credential key's value is
    :data:`~raycompat.io.credentials.REDACTED`, every string is scrubbed of registered secrets
    and cut at :data:`MAX_PARAMETER_CHARS`, a list at :data:`MAX_PARAMETER_ITEMS` items, and
    anything not JSON becomes its ``repr``.
    """
    check_name("operation", kind)
    return dataclasses.replace(info, operation=kind, parameters=_small(parameters))


def _small(value: Any) -> Any:
    if isinstance(value, bool | int | float) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): REDACTED if is_secret_key(k) else _small(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_small(v) for v in value[:MAX_PARAMETER_ITEMS]]
    text = scrub(value if isinstance(value, str) else repr(value))
    return text if len(text) <= MAX_PARAMETER_CHARS else text[: MAX_PARAMETER_CHARS - 3] + "..."


def publish_record(
    backend: Backend,
    record: str,
    info: VersionInfo,
    on_existing: Callable[[], VersionInfo],
    by: LeaseOwner | None = None,
) -> VersionInfo:
    """Create ``record`` holding ``info``, stamped with ``by``; if it exists already, return
    ``on_existing()``.

    Args:
        backend: the store's backend (local or S3).
        record: path of the version record, ``manifest.record_path(gallery_path, version)``.
        info: the version to publish; it is returned as readers will see it (its ``uri``).
        on_existing: called when another writer created the record first; raises or returns
            the record to use.
        by: who publishes (the holder of the staging area's lease; default: this process).
    """
    info = dataclasses.replace(info, by=dataclasses.asdict(by or LeaseOwner()))
    info = VersionInfo.from_json(info.to_json(), backend.uri(record))
    try:
        backend.create_exclusive(record, info.to_json())
    except FileExistsError:
        return on_existing()
    logger.info("published %s (%d rows, %d files)", record, info.rows, len(info.files))
    return info
