"""One I/O layer: every local or S3 path of the project reaches its filesystem here.

:func:`filesystem` resolves a URI (a local path, ``file://`` or ``s3://bucket/prefix``) and the
user's s3fs ``storage_options`` (:mod:`raycompat.io.s3_options`: one spelling in every config)
into ``(pyarrow FileSystem, path)``; :func:`fsspec_filesystem` is its fsspec form. The store's
backends (:mod:`raycompat.io.filesystems`), training runs (:mod:`raycompat.io.run_storage`),
Tune sweeps and weight files (:mod:`raycompat.io.weights`) all come through them, and the
options pass through :func:`~raycompat.io.credentials.accept_storage_options` on the way
(``<redacted>`` markers dropped, credentials registered for scrubbing). :func:`open_uri` opens
one file by URI, and :func:`check_uri` is what a config check calls on a weights path before any
cluster time (:func:`raycompat.config.checks.check_weight_files`): no torch on the way.

Bulk I/O on S3 uses pyarrow's native ``S3FileSystem`` by default (``bulk_io="native"``;
``benchmarks/store_io.py`` measured it faster than s3fs behind ``FSSpecHandler``; see
``docs/store.md``), built from the same options (:func:`native_s3_options`; the region from
``AWS_DEFAULT_REGION`` / ``AWS_REGION`` when the options name none, and the endpoint from
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` when they name none, as s3fs takes them:
:func:`~raycompat.io.s3_options.with_environment_endpoint`). Options the native client cannot
express make ``bulk_io="auto"`` fall back to s3fs behind ``FSSpecHandler``.

Its errors are ``raycompat.errors``'s (below every layer): ``raycompat.store`` and
``raycompat.config`` import this layer, and it imports neither.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import IO, Any

import pyarrow.fs as pafs

from raycompat.errors import ConfigError, StoreError
from raycompat.io.credentials import accept_storage_options
from raycompat.io.s3_options import with_environment_endpoint

logger = logging.getLogger(__name__)

BULK_IO = ("auto", "native", "fsspec")
# s3fs options that only tune caching on the s3fs side; the native client can ignore them.
_NATIVE_IGNORED = {"skip_instance_cache", "use_listings_cache", "listings_expiry_time"}


def split_uri(uri: str) -> tuple[str, str]:
    """``(scheme, path)``: ``("s3", "bucket/prefix")`` for ``s3://bucket/prefix``;
    ``("file", path)`` for a local path or a ``file://`` URI."""
    scheme, sep, rest = str(uri).partition("://")
    return (scheme, rest) if sep else ("file", str(uri))


def filesystem(
    uri: str, storage_options: Mapping | None = None, bulk_io: str = "auto"
) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path)`` of ``uri``: pyarrow's local filesystem and the absolute path, or
    an S3 filesystem built from the s3fs ``storage_options`` and ``bucket/prefix`` (no
    trailing ``/``). A local path needs no options and ignores them (a store root refuses
    them: :func:`raycompat.io.filesystems.open_backend`).

    Raises:
        ValueError: ``uri`` has a scheme other than ``file`` and ``s3``.
        StoreError: ``bulk_io`` is not one of :data:`BULK_IO`, or it is ``"native"`` and an
            option has no native equivalent.
    """
    scheme, path = split_uri(uri)
    if scheme == "file":
        return pafs.LocalFileSystem(), os.path.abspath(path)
    if scheme != "s3":
        raise ValueError(f"unsupported scheme {scheme!r} in {uri!r} (a local path or s3://)")
    options = with_environment_endpoint(accept_storage_options(storage_options))
    return _s3_bulk(options, bulk_io), path.rstrip("/")


def fsspec_filesystem(uri: str, storage_options: Mapping | None = None) -> tuple[Any, str]:
    """``(fsspec filesystem, path)`` of ``uri`` (any scheme fsspec knows), built from the same
    ``storage_options`` as :func:`filesystem`: for files read whole (weights)."""
    from fsspec.core import url_to_fs

    return url_to_fs(str(uri), **accept_storage_options(storage_options))


def s3fs_filesystem(storage_options: Mapping | None = None) -> Any:
    """The s3fs filesystem of ``storage_options`` (fsspec caches one per set of options)."""
    import fsspec

    return fsspec.filesystem("s3", **accept_storage_options(storage_options))


def native_s3_options(options: Mapping) -> dict[str, Any]:
    """Translate s3fs ``storage_options`` into ``pyarrow.fs.S3FileSystem`` keyword arguments.

    Raises:
        StoreError: an option has no native equivalent (the message lists them).
    """
    opts, client = dict(options), dict(options.get("client_kwargs") or {})
    opts.pop("client_kwargs", None)
    out: dict[str, Any] = {}
    for s3fs_key, native_key in (
        ("key", "access_key"),
        ("secret", "secret_key"),
        ("token", "session_token"),
        ("anon", "anonymous"),
    ):
        if s3fs_key in opts:
            out[native_key] = opts.pop(s3fs_key)
    endpoint = client.pop("endpoint_url", None) or opts.pop("endpoint_url", None)
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        out.update(endpoint_override=host.rstrip("/"), scheme=scheme)
    if "region_name" in client:
        out["region"] = client.pop("region_name")
    left = sorted(set(opts) - _NATIVE_IGNORED) + [f"client_kwargs.{k}" for k in sorted(client)]
    if left:
        raise StoreError(f"storage_options {left} have no pyarrow S3FileSystem equivalent")
    return out


def _s3_bulk(options: dict, bulk_io: str) -> pafs.FileSystem:

    if bulk_io not in BULK_IO:
        raise StoreError(f"bulk_io must be 'auto', 'native' or 'fsspec', got {bulk_io!r}")
    if bulk_io != "fsspec":
        try:
            native = native_s3_options(options)
        except StoreError as error:
            if bulk_io == "native":
                raise
            logger.info("bulk I/O through s3fs: %s", error)
        else:
            region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
            return pafs.S3FileSystem(**{"region": region, **native} if region else native)
    return pafs.PyFileSystem(pafs.FSSpecHandler(s3fs_filesystem(options)))


def open_uri(uri: str, mode: str = "rb", storage_options: dict | None = None) -> IO[Any]:
    """Open ``uri`` (local path, ``file://``, ``s3://bucket/key``, ...) and return the open file.

    Raises ``FileNotFoundError`` naming ``uri`` when nothing is there and ``PermissionError``
    naming it when the store refuses the credentials.
    """
    uri = str(uri)
    try:
        fs, path = fsspec_filesystem(uri, storage_options)  # "<redacted>" entries dropped
        return fs.open(path, mode)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"no file at {uri!r} ({err})") from err
    except PermissionError as err:
        raise PermissionError(
            f"access denied to {uri!r} ({err}): check the credentials for this bucket "
            "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage_options key/secret) and "
            "the endpoint_url in storage_options client_kwargs"
        ) from err


def check_uri(uri: str, key: str) -> None:
    """Fail before any cluster time when ``uri`` (the value of config ``key``) cannot be opened:
    one ``ConfigError`` naming the key, the path and what to do (no download, no retries)."""

    try:
        open_uri(uri).close()
    except (FileNotFoundError, IsADirectoryError) as err:
        raise ConfigError(
            f"{key}: {err}; give the path of a local or s3:// weights file (nothing is "
            "downloaded at run time)"
        ) from None
    except PermissionError as err:
        raise ConfigError(f"{key}: {err}") from None
