"""``raycompat``: inspect a store's galleries and models, and search with any registered model.

    raycompat --version                           the installed version
    raycompat galleries --store ROOT              every gallery: versions, the newest one's
                                                  model and rows, and which version each
                                                  query model searches
    raycompat versions GALLERY --store ROOT       versions, their model, rows, width, dtype,
                                                  lineage, and which models may query each
    raycompat models --store ROOT                 registered model versions
    raycompat history GALLERY --store ROOT        versions and who wrote them, every decision
                                                  (refused, failed) with its reason, grants,
                                                  what each model serves, alias changes
    raycompat search GALLERY IMAGE [IMAGE ...] --model M --store ROOT [-k 5]
    raycompat search GALLERY --vectors Q.npy|Q.parquet ...   query vectors of model M
    raycompat search GALLERY --ids ID [ID ...] ...  query with rows stored in M's version
    raycompat search ... --nprobe N               inverted lists an IVF index visits per query
    raycompat index build GALLERY --version V --store ROOT [--kind auto|flat|ivfpq|sharded_ivf]
                                                  build and publish a version's faiss index
    raycompat index verify GALLERY --version V --store ROOT [--queries N]
                                                  its checksums and recall@10 against exact
                                                  search
    raycompat promote GALLERY --model M --version V --store ROOT
                                                  M serves version V from now on (an alias;
                                                  the previous one is kept for rollback)
    raycompat rollback GALLERY --model M --store ROOT
                                                  M serves again what it served before
    raycompat revoke GALLERY --model M --store ROOT
                                                  M serves nothing on the gallery
    raycompat retire M --store ROOT [--reason R]  M serves no gallery, takes no new grant
    raycompat alias set GALLERY NAME --version V --model M --store ROOT
                                                  the named alias (prod) points at a
                                                  compatible (version, query model) pair
    raycompat alias rollback|list GALLERY [NAME] --store ROOT
                                                  undo its newest change; list the aliases
    raycompat search GALLERY --alias NAME ...     search what a named alias points at
    raycompat status [GALLERY] --store ROOT       live leases, staging areas, their progress
    raycompat adopt GALLERY URI --store ROOT --version V --model M
        [--id-column C] [--embedding-column C]    publish an existing Parquet table (folder or
                                                  s3:// prefix) as a version, in place; Ray
                                                  validates it (docs/store.md); a rerun
                                                  completes a killed one
    raycompat adopt GALLERY iceberg:NS.TABLE --catalog-uri sqlite:///catalog.db ...
                                                  an Iceberg table named in a SQL catalog
    raycompat export GALLERY TARGET --store ROOT --version V --format delta|iceberg
        [--mode overwrite] [--catalog-uri URL --warehouse DIR]
                                                  write a version as a Delta table (TARGET a
                                                  folder or s3:// URI) or an Iceberg table
                                                  (TARGET namespace.table); float16 -> float32
    raycompat gc --store ROOT [--older-than 8d] [--keep-versions K] [--dry-run]
                                                  only in a marked store; --dry-run also
                                                  says what it keeps and why
    raycompat mark-store --store ROOT [--force]   mark a store written before markers
    raycompat report RUN_DIR [--json]             an upgrade run's report (report.md, or the
                                                  decisions and matrix as JSON)

The gallery is the first positional argument of every command that names one
(``cli/arguments.py``).

Each command is defined once, as a :class:`~raycompat.cli.command.Command` in its group's
module under ``cli/commands/`` (its arguments, handler, renderer and example); this module
builds the parser from :data:`raycompat.cli.commands.REGISTRY` and dispatches. Every command
that reads or writes a store takes the jobs' S3 options (``cli/store_options.py``):
``--endpoint-url URL`` (default ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``),
``--profile NAME`` and ``--storage-options JSON`` (more s3fs ``storage_options``; credentials
in it are scrubbed from every line printed); a local ``--store`` ignores them.

Every subcommand's ``--help`` describes each option and ends with an example command. A
gallery, model or version that does not exist is one line (exit 1,
:class:`~raycompat.errors.NotInStoreError`) listing those that do and the nearest name
(``store/read/lookup.py``); a missing report folder lists the runs beside it.

Listings print aligned tables (``cli/tables.py``); ``--json`` prints the same data as JSON for
scripts. ``search`` prints id, score and the stored label of each hit: only items found, so a
query gets fewer than ``-k`` where the version holds fewer rows or an IVF index's probed lists
hold fewer (a note on stderr says so; ``--nprobe`` visits more). stdout carries only the
listing: faiss's own printing goes to stderr, and ``--json`` is always valid JSON.

``search`` embeds the images with model M (or takes ``--vectors`` / ``--ids``), finds the
gallery version M serves (its newest alias, else its catalog grant: extracted, compatible or
transformed; a model revoked there or retired is refused, ``serving/served_log.py``), and searches
that version's published faiss index (``raycompat index build`` makes one; without a valid one
a version of up to 100 000 rows is searched exactly in memory, a note on stderr says so, and a
larger one is refused, naming ``index build``: read commands never write to the store). A
compatible model of another width is compared on the shared first coordinates (BCT:
zero-padding), as in training. No Ray: the query path is the core's (``serving/query_path.py``,
``search_gallery``); ``cli/commands/search.py`` parses, prints notes on stderr and renders.

A corrupt record does not hide the others: ``versions`` and ``models`` list the readable ones,
name each corrupt one (file and error) and exit 1. Errors are one line (``cli/errors.py``), with
the exit status of their type (``raycompat/errors.py``; README.md, "Exit status"): 2 for a
usage error (no store at ``--store``; a ``-k`` below 1, an unreadable, empty or malformed query
file: :class:`~raycompat.serving.query_inputs.QueryError`), 1 for a store or data error (a
gallery, model or version that does not exist among them); ``--debug`` shows the traceback.
Ctrl-C is one line too, ``raycompat: interrupted; <what a rerun does>`` (the command's
``resumes``), exit 130.
stderr holds only our lines: other libraries' INFO lines (faiss' loader) appear with
``--verbose`` (:mod:`raycompat.console`).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys

from raycompat.cli.arguments import CommandParser, VersionAction, global_flags, json_flag
from raycompat.cli.command import PROG
from raycompat.cli.commands import REGISTRY
from raycompat.cli.errors import (
    INTERRUPTED_EXIT,
    RESTARTS,
    debug_requested,
    error_line,
    interrupted_line,
    interruptible,
)
from raycompat.console import configure_console
from raycompat.errors import RaycompatError, exit_status

# Imports stay light: torch, Ray and faiss load inside the handlers that use them, so --help,
# versions and search --vectors/--ids start without torch or Ray (tests/cli/test_startup.py).

# The handler of each command, by name: what main() calls (tests replace one to fail it).
COMMANDS = {name: command.handler for name, command in REGISTRY.items()}


def parser() -> argparse.ArgumentParser:
    """The global flags and one subparser per registered command."""
    flags = global_flags()
    top = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0], parents=[flags])
    top.add_argument("--version", action=VersionAction, help="print the installed version and exit")
    sub = top.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    as_json = json_flag()
    for name, command in REGISTRY.items():
        p = sub.add_parser(
            name,
            help=command.help,
            description=command.help_text(),
            parents=[flags, as_json] if command.as_json else [flags],
            formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the example's line
        )
        command.add_arguments(p)
    return top


BROKEN_PIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for `git log | head -1`


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0, 1 for a data error (a corrupt record among those listed, a grant that
    is missing, an unknown gallery, model or version; any
    :class:`~raycompat.errors.DataError`) or a missing file, 2 for a usage error (no store at
    ``--store``, a :class:`~raycompat.serving.query_inputs.QueryError`; any
    :class:`~raycompat.errors.UsageError`).

    A reader that stops early (``raycompat history G --store S | head -1``) ends the command
    quietly, as it ends ``git log``: no traceback, exit :data:`BROKEN_PIPE_EXIT` (141, what the
    shell reports for a process that SIGPIPE ends; only ``set -o pipefail`` sees it).

    Ctrl-C (SIGINT, also in a command started with SIGINT ignored, as a script's ``cmd &``
    starts it) is one line, ``raycompat: interrupted; <what a rerun does>`` (the command's
    ``resumes``), exit 130, as in the jobs (``cli/errors.py``); ``--debug`` shows where."""
    interruptible()
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is caught here too
    except BrokenPipeError:
        _stdout_to_devnull()
        return BROKEN_PIPE_EXIT
    except KeyboardInterrupt:  # before or after the handler ran: nothing of it to resume
        if debug_requested(sys.argv[1:] if argv is None else argv):
            raise
        print(interrupted_line(PROG, RESTARTS), file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    return code


def _stdout_to_devnull() -> None:
    """Python flushes stdout again at exit, into the closed pipe: point its file descriptor
    at devnull so that the last flush is silent (Python's documented recipe for SIGPIPE)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (captured): nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _main(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    # Our lines, scrubbed; faiss', pyiceberg's and other libraries' INFO only with --verbose.
    configure_console(getattr(args, "verbose", False), "%(name)s: %(message)s", sys.stderr)
    debug = getattr(args, "debug", False) or debug_requested()
    command = REGISTRY[args.command]
    problem = command.check(args) if command.check else None
    if problem:
        print(error_line(PROG, problem), file=sys.stderr)
        return 2
    try:
        out = COMMANDS[args.command](args)
    except KeyboardInterrupt:  # Ctrl-C: Ray raises it in ray.get, faiss after its C++ call
        if debug:
            raise
        print(interrupted_line(PROG, command.resumes), file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    except (RaycompatError, FileNotFoundError) as err:  # and a missing report.md: exit 1
        if debug:
            raise
        print(error_line(PROG, err), file=sys.stderr)
        return exit_status(err)
    except OSError as err:  # storage unreachable, refused or denied: the user's to fix
        if debug:
            raise
        if err.errno == errno.ENOSPC:  # the disk filled: the store's options are not at fault
            where = f" writing {err.filename}" if err.filename else ""
            print(error_line(PROG, f"no space left on device{where}"), file=sys.stderr)
            return 1
        hint = "check --store, --endpoint-url and the credentials; --debug shows the traceback"
        print(
            error_line(PROG, f"storage error: {' '.join(str(err).split())} ({hint})"),
            file=sys.stderr,
        )
        return 1
    print(_text(command, out, as_json=getattr(args, "json", False)))
    corrupt = out.get("corrupt", []) if isinstance(out, dict) else []
    for record in corrupt:  # listed on stdout too; stderr says the listing is incomplete
        print(error_line(PROG, f"corrupt record skipped: {record['error']}"), file=sys.stderr)
    return 1 if corrupt else 0


def _text(command, out: dict | str, *, as_json: bool) -> str:
    """A handler's answer as printed: a line as is, a dict as JSON or through its renderer."""
    if isinstance(out, str):
        return out
    if as_json or command.render is None:
        return json.dumps(out, indent=2, default=str)
    return command.render(out)


if __name__ == "__main__":
    sys.exit(main())
