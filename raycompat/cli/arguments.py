"""The ``raycompat`` command's arguments: one function per subcommand, and the table of them.

:data:`SUBCOMMANDS` maps each subcommand's name to its help, the function that adds its
arguments and an example command line; :func:`build_parser` adds ``--version`` and the global
flags (``--debug``, ``--verbose``, accepted before or after the subcommand) and one subparser
per entry, in the table's order, whose ``--help`` ends with ``example: raycompat ...``. Every
option has a help text (``tests/cli/test_arguments.py`` walks the parser to check it). The
handlers are in :mod:`raycompat.cli.app` (``COMMANDS``). Argument types (:func:`duration_s`,
:func:`positive_int`, ``--as-of``) fail as usage errors, exit 2. Imports stay light: ``--help``
loads neither torch nor Ray.

Every command that opens a store adds ``--store`` with :func:`add_store_arguments`, which adds
the S3 options the jobs' configs spell as s3fs ``storage_options`` (``--endpoint-url``,
``--profile``, ``--storage-options``); :func:`storage_options` turns them into that dict, and
``app.open_store`` builds the store from it.
"""

from __future__ import annotations

import argparse
import json
import logging
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from raycompat.cli import index_commands, serving
from raycompat.cli.errors import DEBUG_ENV, DEBUG_FLAG
from raycompat.errors import UsageError
from raycompat.store.retention import DEFAULT_RETENTION_S

logger = logging.getLogger(__name__)

STORE_HELP = "store root: a folder or s3://bucket/prefix"
GALLERY_HELP = "a gallery of the store (an unknown name lists those that exist)"
RAY_ADDRESS_HELP = (
    "Ray address (default: RAY_ADDRESS, else a local Ray that ends with the command, "
    "even a killed one)"
)
_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float:
    """``"24h"``, ``"90m"``, ``"2d"``, ``"30s"`` or plain seconds -> seconds."""
    unit = text[-1:].lower()
    number = text[:-1] if unit in _DURATION else text
    try:
        value = float(number) * _DURATION.get(unit, 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration like 24h, 90m or 3600"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be >= 0")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (``--nprobe``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return value


def as_of(text: str) -> str:
    """``--as-of``, checked by argparse (a usage error, exit 2) and passed on as given."""
    from raycompat.store.formats import parse_as_of

    try:
        parse_as_of(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


# ---- --store and its S3 options --------------------------------------------------------------

S3_FLAGS = {"endpoint_url": "--endpoint-url", "profile": "--profile"}


class StorageOptionsError(UsageError, ValueError):
    """``--storage-options`` is no JSON object, or it and ``--endpoint-url`` / ``--profile``
    name different values (exit 2). The message never repeats the flag's text: it may hold
    credentials."""


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


# ---- one function per subcommand -------------------------------------------------------------


def _galleries_arguments(p: argparse.ArgumentParser) -> None:
    add_store_arguments(p)


def _versions_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("gallery", help=GALLERY_HELP)
    add_store_arguments(p)


def _models_arguments(p: argparse.ArgumentParser) -> None:
    add_store_arguments(p)


def _search_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="*", type=str, help="query images, embedded with --model")
    p.add_argument("--vectors", help="query vectors of --model: a .npy (Q, d) or a Parquet file")
    p.add_argument("--ids", nargs="+", help="query with rows stored in the version --model queries")
    add_store_arguments(p)
    p.add_argument("--gallery", required=True, help=GALLERY_HELP)
    p.add_argument(
        "--model",
        required=True,
        help="a registered model version; searches the gallery version it may query",
    )
    p.add_argument("-k", type=int, default=5, help="hits per query (default 5)")
    p.add_argument(
        "--nprobe",
        type=positive_int,
        default=None,
        help="inverted lists visited per query by an IVF index (default: the build's, which "
        "grows with the gallery; ignored by an exact flat index)",
    )


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the run's report directory, e.g. outputs/upgrade/report/<name>")
    p.add_argument("--json", action="store_true", help="report.json instead of report.md")


def _gc_arguments(p: argparse.ArgumentParser) -> None:
    add_store_arguments(p, STORE_HELP + " (a marked one)")
    p.add_argument(
        "--older-than",
        type=duration_s,
        default=None,
        help="only what is older than this (8d, 36h or seconds; default and minimum: the "
        "store's retention, set in its marker when it was created, "
        f"{DEFAULT_RETENTION_S / 86400:g}d unless chosen then)",
    )
    p.add_argument(
        "--keep-versions",
        type=int,
        default=None,
        help="also remove published versions older than the newest K, unless a registered "
        "model queries them or the newest version's lineage names them",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would go and what is kept, with reasons; delete nothing",
    )


def _mark_store_arguments(p: argparse.ArgumentParser) -> None:
    add_store_arguments(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="mark it even if it holds no version record and no model catalog yet",
    )


def _adopt_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "uri",
        help="a Delta or Iceberg table, or a folder of *.parquet files (local or s3://); or "
        "iceberg:<namespace>.<table> in --catalog-uri",
    )
    add_store_arguments(p)
    p.add_argument("--gallery", required=True, help="the gallery to publish into (new or not)")
    p.add_argument("--version", required=True, help="the new version's name")
    p.add_argument(
        "--model",
        required=True,
        help="the embeddings' model; registered if new, and granted the version",
    )
    p.add_argument("--id-column", default="id", help="the table's id column (default id)")
    p.add_argument(
        "--embedding-column", default="embedding", help="its vector column (default embedding)"
    )
    p.add_argument(
        "--normalized",
        choices=["auto", "yes", "no"],
        default="auto",
        help="mark the version normalized: auto (iff every row is unit-norm), yes (required), no",
    )
    p.add_argument(
        "--as-of",
        type=as_of,
        default=None,
        help="a Delta version or Iceberg snapshot id, or an ISO timestamp (default: current)",
    )
    p.add_argument(
        "--catalog-uri",
        default=None,
        help="for URI iceberg:<namespace>.<table>: the SQL catalog (sqlite:///path/catalog.db)",
    )
    p.add_argument("--warehouse", default=None, help="the catalog's warehouse (optional)")
    p.add_argument("--address", default=None, help=RAY_ADDRESS_HELP)


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target", help="Delta: a folder or s3:// URI; Iceberg: namespace.table in --catalog-uri"
    )
    add_store_arguments(p)
    p.add_argument("--gallery", required=True, help=GALLERY_HELP)
    p.add_argument("--version", required=True, help="the published version to export")
    p.add_argument(
        "--format", required=True, choices=["delta", "iceberg"], help="the table format to write"
    )
    p.add_argument(
        "--mode",
        choices=["error", "overwrite"],
        default=None,
        help="Delta: overwrite replaces an existing Delta table's rows (default: refuse it)",
    )
    p.add_argument("--catalog-uri", help="Iceberg: the SQL catalog, e.g. sqlite:///catalog.db")
    p.add_argument("--warehouse", help="Iceberg: where its tables live (a folder or s3:// URI)")


def _history_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("gallery", help="the gallery's name (an unknown one lists those that exist)")
    add_store_arguments(p)


# ---- the table -------------------------------------------------------------------------------


STORE = "outputs/upgrade/store"  # the examples' store: what `python jobs/upgrade.py` writes


@dataclass(frozen=True)
class Subcommand:
    """One entry of the table: its ``--help`` line, the function adding its arguments, and an
    example command (shown as ``example: raycompat ...`` in the subcommand's ``--help``)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    as_json: bool = True  # takes --json: JSON instead of a table
    description: str | None = None  # default: the help line
    example: str | None = None  # a command line, starting "raycompat "


SUBCOMMANDS = {
    "galleries": Subcommand(
        "every gallery of a store: its versions, the newest one's model and rows, and which "
        "version each query model searches",
        _galleries_arguments,
        example=f"raycompat galleries --store {STORE}",
    ),
    "versions": Subcommand(
        "a gallery's versions, lineage and query models",
        _versions_arguments,
        example=f"raycompat versions mnist --store {STORE}",
    ),
    "models": Subcommand(
        "registered model versions",
        _models_arguments,
        example=f"raycompat models --store {STORE} --json",
    ),
    "search": Subcommand(
        "top-k gallery ids for query images, vectors or stored ids",
        _search_arguments,
        example=f"raycompat search --store {STORE} --gallery mnist --model m1 --ids 17 -k 5",
    ),
    "report": Subcommand(
        "show an upgrade run's report",
        _report_arguments,
        as_json=False,
        example="raycompat report outputs/upgrade/report/mnist-history",
    ),
    "gc": Subcommand(
        "remove abandoned staging areas, stale temporary files, old index builds and "
        "(with --keep-versions) superseded versions",
        _gc_arguments,
        example=f"raycompat gc --store {STORE} --keep-versions 2 --dry-run",
    ),
    "mark-store": Subcommand(
        "mark a store written before store markers, so gc may manage it",
        _mark_store_arguments,
        as_json=False,
        example="raycompat mark-store --store s3://bucket/raycompat/store",
    ),
    "adopt": Subcommand(
        "publish an existing table (Delta, Iceberg or a Parquet folder; local or s3://) as "
        "a version, in place (no copy); its files are pinned and validated on Ray",
        _adopt_arguments,
        example="raycompat adopt s3://bucket/tables/faces --store s3://bucket/store "
        "--gallery faces --version v1 --model m1",
    ),
    "export": Subcommand(
        "write a version as a Delta or Iceberg table that Spark, Trino, DuckDB and Ray "
        "Data read without raycompat (float16 is widened to float32)",
        _export_arguments,
        example=f"raycompat export /tmp/mnist_v1 --store {STORE} --gallery mnist --version v1 "
        "--format delta",
    ),
    "history": Subcommand(
        "a gallery's story: versions and who wrote them, every decision (refused and "
        "failed too) with its reason, and which model queries which version",
        _history_arguments,
        example=f"raycompat history mnist --store {STORE}",
    ),
    "promote": Subcommand(**serving.SPECS["promote"]),  # cli/serving.py
    "rollback": Subcommand(**serving.SPECS["rollback"]),  # cli/serving.py
    "revoke": Subcommand(**serving.SPECS["revoke"]),  # cli/serving.py
    "index": Subcommand(**index_commands.SPEC),  # cli/index_commands.py
    "retire": Subcommand(**serving.SPECS["retire"]),  # cli/serving.py
}


def description_of(command: Subcommand) -> str:
    """The subcommand's ``--help`` text: its description (or help line), then its example."""
    text = command.description or textwrap.fill(command.help, 78)
    return f"{text}\n\nexample: {command.example}" if command.example else text


def package_version() -> str:
    """The installed package's version (``importlib.metadata``; no torch, no Ray)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raycompat")
    except PackageNotFoundError:  # a checkout used without `pip install -e .`
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``--version``: looks the version up only when asked (the metadata scan of every
    installed distribution costs ~70 ms, which ``--help`` should not pay)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {package_version()}")  # stdout, as argparse's own "version"
        parser.exit()


def _global_flags() -> argparse.ArgumentParser:
    """``--debug`` and ``--verbose``, a parent of the top parser and of every subcommand."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        DEBUG_FLAG,
        action="store_true",
        default=argparse.SUPPRESS,  # so a subcommand's default cannot reset the top-level flag
        help=f"show the traceback of an error (or set {DEBUG_ENV}=1)",
    )
    flags.add_argument(
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show our debug log lines too (weights read, datasets opened...)",
    )
    return flags


def build_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The top parser and one subparser per entry of :data:`SUBCOMMANDS`."""
    flags = _global_flags()
    top = argparse.ArgumentParser(prog=prog, description=description, parents=[flags])
    top.add_argument("--version", action=_Version, help="print the installed version and exit")
    sub = top.add_subparsers(dest="command", required=True)
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="JSON instead of a table")
    for name, command in SUBCOMMANDS.items():
        parents = [flags, as_json] if command.as_json else [flags]
        p = sub.add_parser(
            name,
            help=command.help,
            description=description_of(command),
            parents=parents,
            formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the example's line
        )
        command.add_arguments(p)
    return top
