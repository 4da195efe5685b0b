"""Name and path checks that keep every store access under the store prefix.

Gallery, version, staging and part-file names are single path segments matching
:data:`SAFE_NAME`: they start with a letter or digit (so never ``.``/``..``, never ``_``, which
the store reserves for its own folders ``_versions``, ``_data``, ``_index``) and contain no ``/``.
Paths read back from a manifest record are relative POSIX paths that must stay under the
gallery prefix: no absolute paths, no URL schemes, no ``..`` segments, no backslashes.
"""

from __future__ import annotations

import re

from raycompat.errors import UnsafePathError

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,127}")


def check_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a safe single path segment, else raise :class:`UnsafePathError`.

    Args:
        kind: what the name is (``"gallery"``, ``"version"``...), used in the message.
    """
    if not isinstance(name, str) or SAFE_NAME.fullmatch(name) is None:
        raise UnsafePathError(
            f"{kind} name {name!r} is not allowed: use 1-128 characters from [A-Za-z0-9._=-], "
            f"starting with a letter or digit (no '/', no leading '.' or '_')"
        )
    return name


def check_relative_path(path: object, source: str) -> str:
    """Validate a path read from a manifest record: relative, normalised, under the gallery.

    Args:
        path: e.g. ``"_data/v3/job-1/part-00000.parquet"``.
        source: the record it came from, named in the error.
    Returns:
        ``path`` unchanged.
    """
    if not isinstance(path, str) or not path:
        raise UnsafePathError(f"{source}: file path {path!r} must be a non-empty string")
    segments = path.split("/")
    bad = (
        path.startswith("/")
        or "\\" in path
        or ":" in segments[0]
        or any(s in ("", ".", "..") for s in segments)
    )
    if bad:
        raise UnsafePathError(
            f"{source}: file path {path!r} is not a normalised relative path under the gallery "
            f"prefix (absolute paths, URL schemes, '..', '.', '//' and '\\' are refused)"
        )
    return path


def join(*parts: str) -> str:
    """Join filesystem path parts with ``/`` (S3 keys and local POSIX paths alike)."""
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts) if p)
