"""Open a file by URI (a local path, ``file://`` or ``s3://bucket/key``) through fsspec
(:func:`raycompat.io.uri.fsspec_filesystem`), and check that one opens, without torch.

:func:`check_uri` is what a config check calls on a weights path before any cluster time
(:func:`raycompat.config.checks.check_weight_files`); :mod:`raycompat.io.weights` reads the
weights themselves with :func:`open_uri` and re-exports both.
"""

from __future__ import annotations

from typing import IO, Any

from raycompat.io.uri import fsspec_filesystem


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
    from raycompat.config import ConfigError

    try:
        open_uri(uri).close()
    except (FileNotFoundError, IsADirectoryError) as err:
        raise ConfigError(
            f"{key}: {err}; give the path of a local or s3:// weights file (nothing is "
            "downloaded at run time)"
        ) from None
    except PermissionError as err:
        raise ConfigError(f"{key}: {err}") from None
