"""The one S3 setting: s3fs ``storage_options``, spelled the same in every config.

The store (``store.storage_options``), training runs (``run.storage_options``), sweeps
(``storage_options``) and weight files all take s3fs's options: ``key``, ``secret``, ``token``,
``anon``, ``client_kwargs={"endpoint_url": ..., "region_name": ...}``. What is absent comes from
the environment (``AWS_ACCESS_KEY_ID`` ..., ``AWS_DEFAULT_REGION``) or the instance role.

This module only reads and rewrites those dicts (no pyarrow, no s3fs), so config loading can
use it: :func:`with_endpoint` folds the deprecated ``endpoint_url`` of the run and sweep configs
into ``client_kwargs.endpoint_url``, and :func:`with_environment_endpoint` the endpoint of
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` when the options name none (s3fs, through
botocore, reads those variables itself; pyarrow's native S3 client does not, so without it an
endpoint set only in the environment would reach the records and not the Parquet files).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

from raycompat.errors import ConfigError


def endpoint_of(options: Mapping | None) -> str | None:
    """The S3-compatible endpoint ``options`` name (``client_kwargs.endpoint_url``, or s3fs's
    top-level ``endpoint_url``), or None for AWS itself."""
    options = options or {}
    client = options.get("client_kwargs") or {}
    return client.get("endpoint_url") or options.get("endpoint_url")


# botocore's order: the S3 one first (AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true turns both off)
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def environment_endpoint() -> str | None:
    """The S3 endpoint this process's environment names (:data:`ENDPOINT_ENV`), or None."""
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return None
    return next((os.environ[name] for name in ENDPOINT_ENV if os.environ.get(name)), None)


def with_environment_endpoint(options: Mapping | None) -> dict:
    """``options`` (s3fs ``storage_options`` of an ``s3://`` path) with
    ``client_kwargs.endpoint_url`` set to :func:`environment_endpoint` when they name no
    endpoint themselves; ``options`` itself is not changed."""
    options = dict(options or {})
    endpoint = None if endpoint_of(options) else environment_endpoint()
    return with_client_endpoint(options, endpoint) if endpoint else options


def with_client_endpoint(options: Mapping, endpoint: str) -> dict:
    """A copy of ``options`` whose ``client_kwargs.endpoint_url`` is ``endpoint``."""
    client = {**(options.get("client_kwargs") or {}), "endpoint_url": endpoint}
    return {**options, "client_kwargs": client}


def with_endpoint(where: str, storage_options: dict, endpoint_url: str | None) -> dict:
    """``storage_options`` with the deprecated ``<where>.endpoint_url`` setting moved into
    ``client_kwargs.endpoint_url``; a one-line ``DeprecationWarning`` names the new key.

    Raises:
        ConfigError: both name an endpoint, and not the same one.
    """
    if not endpoint_url:
        return storage_options
    new_key = f"{where}storage_options.client_kwargs.endpoint_url"
    warnings.warn(
        f"{where}endpoint_url is deprecated: set {new_key} (the store's spelling)",
        DeprecationWarning,
        stacklevel=4,  # with_endpoint <- __post_init__ <- __init__ <- the caller
    )
    given = endpoint_of(storage_options)
    if given == endpoint_url:
        return storage_options
    if given:
        raise ConfigError(
            f"{where}endpoint_url={endpoint_url!r} and {new_key}={given!r} disagree; "
            f"set only {new_key}"
        )
    return with_client_endpoint(storage_options, endpoint_url)
