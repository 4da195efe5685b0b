"""Record paths relative to the store root, so that a copied or synced store still works.

A record that names a file or folder *inside* the store holds its path relative to the root
(``_models/m3``), and readers resolve it against the root they opened (``docs/store.md``,
"Paths in records"). A path *outside* the store (an external model folder, an adopted table's
``external.root``) stays absolute: moving the store does not move it.

Records written before this rule hold absolute URIs; they are read as before, except that one
naming a place under the root opened now is read as its relative path (the two name the same
thing), so a rerun that writes the relative form finds the record unchanged.
"""

from __future__ import annotations

import posixpath

from raycompat.io.filesystems import Backend
from raycompat.store.paths import check_relative_path, join


def is_absolute(uri: str) -> bool:
    """A local absolute path or a URI with a scheme (``s3://``, ``file://``)."""
    return uri.startswith("/") or "://" in uri


def _normal(backend: Backend, uri: str) -> str:
    if backend.scheme == "file":
        uri = uri.removeprefix("file://")
        return posixpath.normpath(uri) if uri.startswith("/") else uri
    return uri.rstrip("/")


def to_record(backend: Backend, uri: str) -> str:
    """The form of ``uri`` a record holds: relative to the root when it lies under it, else
    unchanged (``""``, a path outside the store, a path already relative)."""
    if not uri or not is_absolute(uri):
        return uri
    root, found = _normal(backend, backend.uri(backend.root)), _normal(backend, uri)
    if found.startswith(root.rstrip("/") + "/"):
        return found[len(root.rstrip("/")) + 1 :]
    return uri


def resolve(backend: Backend, uri: str, source: str) -> str:
    """The URI a record's ``uri`` names under the root opened now: a relative path joined to
    the root (checked to stay under it; the error names ``source``), anything else as is."""
    if not uri or is_absolute(uri):
        return uri
    return backend.uri(join(backend.root, check_relative_path(uri, source)))
