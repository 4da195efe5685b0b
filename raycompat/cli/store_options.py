"""``--store`` and its S3 options, and the store they name.

Every command that opens a store adds ``--store`` with :func:`add_store_arguments`, which adds
the S3 options the jobs' configs spell as s3fs ``storage_options`` (``--endpoint-url``,
``--profile``, ``--storage-options``); :func:`storage_options` turns them into that dict, and
:func:`open_store` builds the store from it and reaches it once: a store it cannot reach (no
server at the endpoint, no credentials, access denied) is one line naming the store and the
endpoint, exit 1 (:class:`StoreUnreachableError`), not botocore's or pyarrow's traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING

from raycompat.errors import DataError, UsageError

if TYPE_CHECKING:  # the store (pyarrow, fsspec) loads when a command opens one, not for --help
    from raycompat.store import GalleryStore

logger = logging.getLogger(__name__)

STORE_HELP = "store root: a folder or s3://bucket/prefix"
S3_FLAGS = {"endpoint_url": "--endpoint-url", "profile": "--profile"}


class StorageOptionsError(UsageError, ValueError):
    """``--storage-options`` is no JSON object, or it and ``--endpoint-url`` / ``--profile``
    name different values (exit 2). The message never repeats the flag's text: it may hold
    credentials."""


class StoreUnreachableError(DataError):
    """The store named by ``--store`` could not be reached: a connection refused or timed
    out, missing credentials, access denied. One line naming the store, the endpoint and the
    cause (exit 1); ``--debug`` shows the traceback."""


def add_store_arguments(p: argparse.ArgumentParser, help: str = STORE_HELP) -> None:
    """``--store`` (required) and its S3 options, read by :func:`storage_options`."""
    p.add_argument("--store", required=True, help=help)
    s3 = p.add_argument_group(
        "S3 options", "the jobs' s3fs storage_options; ignored for a local --store"
    )
    s3.add_argument(
        "--endpoint-url",
        metavar="URL",
        help="an S3-compatible endpoint, e.g. http://127.0.0.1:9000 (storage_options "
        "client_kwargs.endpoint_url; default: AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, "
        "else AWS)",
    )
    s3.add_argument(
        "--profile",
        metavar="NAME",
        help="the AWS profile whose credentials are used (s3fs profile; default: the "
        "environment's credentials or AWS_PROFILE)",
    )
    s3.add_argument(
        "--storage-options",
        metavar="JSON",
        help='more s3fs storage_options, a JSON object, e.g. \'{"client_kwargs": '
        '{"region_name": "eu-west-1"}}\' (credentials are scrubbed from the output)',
    )


def open_store(
    args: argparse.Namespace, *, must_exist: bool = True, gallery: str | None = None
) -> GalleryStore:
    """The store at ``--store``, reached with the command line's S3 options (every store
    command opens its store here). A mistyped root is a MissingStoreError (exit 2), not an
    empty listing, unless ``must_exist`` is False (a writer creates the store with its first
    record). With ``gallery``, that gallery must exist (NotInStoreError listing the galleries,
    exit 1)."""
    from raycompat.store import GalleryStore

    store = GalleryStore(args.store, storage_options(args, args.store))
    present = reach_store(store, CLI_HINT)
    if must_exist and not present:
        store.check_exists()  # MissingStoreError, naming the root
    if gallery is not None:
        from raycompat.store.read.lookup import check_gallery

        check_gallery(store, gallery)
    return store


CLI_HINT = "check --store, --endpoint-url and the credentials"
JOB_HINT = "check store.root, store.storage_options, AWS_ENDPOINT_URL and the credentials"


def reach_store(store: GalleryStore, hint: str = CLI_HINT) -> bool:
    """Whether the store's root exists, asked with the first request a command or job makes:
    an unreachable store (refused, timed out, no credentials, access denied) is
    :class:`StoreUnreachableError`, one line naming the root, the endpoint, the cause and
    ``hint`` (what to check), instead of the client's traceback."""
    try:
        return store.exists()
    except Exception as error:
        if not _unreachable(error):
            raise
        line = _unreachable_line(store.root, store.storage_options, error, hint)
        raise StoreUnreachableError(line) from error


def _unreachable(error: BaseException) -> bool:
    """An I/O error (pyarrow's native S3 client, s3fs's translations, a local disk) or one of
    botocore's own (s3fs passes a refused connection or missing credentials on as those).
    botocore is looked up, not imported: its errors exist only once it is loaded."""
    botocore = sys.modules.get("botocore.exceptions")
    return isinstance(error, OSError) or (
        botocore is not None and isinstance(error, botocore.BotoCoreError)
    )


def _unreachable_line(uri: str, options: dict, error: BaseException, hint: str) -> str:
    from raycompat.io.s3_options import endpoint_of, environment_endpoint
    from raycompat.io.uri import split_uri

    cause = " ".join(str(error).split()) or type(error).__name__
    if split_uri(uri)[0] != "s3":
        return f"{uri}: storage error ({cause})"
    endpoint = endpoint_of(options) or environment_endpoint() or "AWS (no --endpoint-url)"
    where = f"{uri}: storage error at endpoint {endpoint}"
    return f"{where} ({cause}); {hint} (--debug shows the traceback)"


def storage_options(args: argparse.Namespace, uri: str) -> dict:
    """The s3fs ``storage_options`` the S3 flags give ``uri``: ``--storage-options`` with
    ``--endpoint-url`` (as ``client_kwargs.endpoint_url``) and ``--profile`` set in it, else
    the environment's endpoint (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``); ``{}`` for a
    local ``uri``. Credential values are registered for scrubbing first, before anything can
    print them.

    Raises:
        StorageOptionsError: see the class (a usage error, exit 2).
    """
    from raycompat.io.credentials import register_secrets
    from raycompat.io.s3_options import (
        endpoint_of,
        with_client_endpoint,
        with_environment_endpoint,
    )
    from raycompat.io.uri import split_uri

    options = _json_object(getattr(args, "storage_options", None))
    register_secrets(options)
    given = {key: getattr(args, key, None) for key in S3_FLAGS}
    found = {"endpoint_url": endpoint_of(options), "profile": options.get("profile")}
    for key, flag in S3_FLAGS.items():
        if given[key] and found[key] and given[key] != found[key]:
            raise StorageOptionsError(
                f"{flag} and --storage-options name different {key.replace('_', ' ')}s; "
                "give it once"
            )
    if split_uri(uri)[0] != "s3":
        named = [flag for key, flag in S3_FLAGS.items() if given[key]]
        if options:
            named.append("--storage-options")
        if named:
            logger.info("%s not used for the local folder %s", ", ".join(named), uri)
        return {}
    if given["profile"]:
        options["profile"] = given["profile"]
    if given["endpoint_url"]:
        options = with_client_endpoint(options, given["endpoint_url"])
    return with_environment_endpoint(options)


_JSON_KINDS = {
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


def _json_object(text: str | None) -> dict:
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as error:  # its message gives the position, not the text
        raise StorageOptionsError(f"--storage-options is not valid JSON ({error})") from None
    if not isinstance(options, dict):
        kind = _JSON_KINDS.get(type(options), "a value")  # never the value: it may be a secret
        raise StorageOptionsError(
            f"--storage-options must be a JSON object of s3fs options, got {kind}"
        )
    return options
