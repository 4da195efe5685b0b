"""The preamble every job in ``jobs/`` shares: its arguments, its config, where its outputs go.

    parser = job_parser(__doc__, "UpgradeConfig")
    args = parser.parse_args(argv)
    cfg = job_config(UpgradeConfig, args, default=UPGRADE_DEFAULT, outputs=("store.root",))
    ...  # the job's own checks
    announce_outputs(cfg, ("store.root",))  # "outputs: store.root=/abs/store"

- ``--config FILE`` and ``key.sub=value`` overrides (list entries too: ``upgrades.0.epochs=1``
  or ``upgrades[0].epochs=1``); without ``--config`` the job says which default it runs.
- ``--print-config`` prints the merged, validated config (credentials redacted) and exits 0.
- Every input and output path follows one rule (:mod:`raycompat.cli.job_paths`): relative
  outputs go under ``--output-root DIR`` (or ``RAYCOMPAT_OUTPUT_ROOT``) and are refused in Ray's
  temporary working-dir copy without one; relative inputs are looked up under ``DIR``, then in
  the current dir. The job logs where its outputs go before it starts (:func:`announce_outputs`).
- ``--dry-run``: validate the config, resolve and check every input and output location, print
  the plan, exit 0; nothing is run or written (:func:`announce_outputs`).

This module imports neither torch nor Ray: ``--help``, ``--print-config`` and a config typo
answer before either loads.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from raycompat.cli.arguments import RAY_ADDRESS_HELP
from raycompat.cli.job_exit import JOB_CONFIG_ENV  # noqa: F401 (imported from here too)
from raycompat.cli.job_paths import (
    OUTPUT_ROOT_ENV,
    check_output_location,
    get_key,
    job_paths,
    resolve_paths,
)
from raycompat.config import dump_config, load_config

C = TypeVar("C")
log = logging.getLogger("raycompat.jobs")


def job_parser(
    doc: str,
    config_type: str,
    *,
    address: bool = True,
    default: str | None = None,
    examples: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """The arguments every job takes (``address``: whether it has ``--address``; ``default``:
    what the job runs without ``--config``, named in ``--help``; ``examples``: command lines
    shown under ``examples:`` in ``--help``, each of which must load, which
    ``tests/cli/test_help_examples.py`` checks)."""
    shown = "".join(f"\n  {line}" for line in examples)
    parser = argparse.ArgumentParser(
        description=doc.splitlines()[0],
        epilog=(f"examples:{shown}\n\n" if examples else "")
        + "Overrides set any key of the config, list entries by index:\n"
        "KEY.0.SUB=1 (or KEY[0].SUB=1).",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # one example a line
    )
    without = f"without it: {default}" if default else "without it the job runs its defaults"
    parser.add_argument("--config", help=f"YAML file with {config_type} keys ({without})")
    if address:
        parser.add_argument("--address", default=None, help=RAY_ADDRESS_HELP)
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show Ray's own lines (its start-up line, Tune's tables, Ray Train's and Ray Data's "
        "progress) and our debug lines",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the merged, validated config (credentials redacted) and exit",
    )
    parser.add_argument(
        "--output-root",
        default=os.environ.get(OUTPUT_ROOT_ENV),
        help=f"resolve relative output paths against this folder, and look relative inputs up "
        f"there first (env {OUTPUT_ROOT_ENV}); needed for relative outputs under "
        "`ray job submit --working-dir` (docs/cluster.md, 'Paths of a submitted job')",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config, resolve and check every input and output location, print "
        "the plan and exit 0; runs and writes nothing",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (RAYCOMPAT_DEBUG=1)"
    )
    parser.add_argument(
        "overrides", nargs="*", help=f"key.sub=value overrides of the {config_type} keys"
    )
    return parser


def job_config(
    cls: type[C],
    args: argparse.Namespace,
    *,
    default: str,
    outputs: Sequence[str] = (),
    inputs: Callable[[C], Sequence[str]] | None = None,
    check: Callable[[C], None] | None = None,
) -> C:
    """Load ``cls`` from ``args``; resolve ``--config``, the output paths named by ``outputs``
    and the input paths ``inputs(cfg)`` names (dotted keys; :mod:`raycompat.cli.job_paths`);
    run the job's ``check(cfg)`` (after registering the config's credentials, so that its line
    is scrubbed of them), so that ``--print-config`` prints only a config the job would run;
    handle ``--print-config`` (prints, then ``SystemExit(0)``)."""
    paths = job_paths(args.output_root)
    if args.config is None:
        log.info("no --config given: running %s", default)
    else:
        args.config = paths.input("--config", args.config)
    cfg = load_config(cls, args.config, args.overrides)
    cfg = resolve_paths(cfg, paths, outputs, inputs(cfg) if inputs else ())
    if check is not None:
        from raycompat.io.credentials import register_secrets

        register_secrets(cfg)
        check(cfg)
    if args.print_config:
        print(dump_config(cfg), end="")
        raise SystemExit(0)
    return cfg


def announce_outputs(
    cfg: Any, outputs: Sequence[str], *, inputs: Sequence[str] = (), dry_run: bool = False
) -> None:
    """Log where the job's outputs go (after its checks, so that a config error stays the
    only line a failing job prints). ``dry_run`` (``--dry-run``): check that every output
    location can be written, print the plan (``inputs`` and ``outputs``, resolved) and exit 0."""
    if outputs:  # a job that only reads (deploy) has none to announce
        log.info("outputs: %s", ", ".join(f"{key}={get_key(cfg, key)}" for key in outputs))
    if not dry_run:
        return
    lines = ["dry run: the config is valid; nothing was run or written"]
    found = [(k, get_key(cfg, k)) for k in inputs if get_key(cfg, k)]
    lines += [f"  input  {k}={v if '://' in v else os.path.abspath(v)}" for k, v in found]
    for key in outputs:
        value = get_key(cfg, key)
        where = value if "://" in value else os.path.abspath(value)
        lines.append(f"  output {key}={where} ({check_output_location(key, value)})")
    print("\n".join(lines), flush=True)
    raise SystemExit(0)


SUMMARY_ITEM_CHARS = 80  # an entry longer than this stays out of the console's summary line


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def summary_line(summary: dict) -> str:
    """``key=value ...`` of the entries of ``summary`` that read on one line: scalars, and
    mappings and lists of scalars, each up to :data:`SUMMARY_ITEM_CHARS` characters; a matrix,
    nested records or a sentence are left to the job's files (its report or summary JSON)."""
    items = []
    for key, value in summary.items():
        values = value.values() if isinstance(value, dict) else value
        nested = isinstance(value, dict | list | tuple) and any(
            isinstance(v, dict | list | tuple) for v in values
        )
        text = f"{key}={_short(value)}"
        if not nested and len(text) <= SUMMARY_ITEM_CHARS:
            items.append(text)
    return " ".join(items)


def log_summary(logger: logging.Logger, summary: dict, label: str = "summary") -> dict:
    """Log the job's ``summary`` as one short line (``summary: decisions={m1: initial, ...}
    AC=0.6513 ...``, :func:`summary_line`), the whole of it as JSON at DEBUG (``--verbose``),
    and return it."""
    logger.info("%s: %s", label, summary_line(summary))
    logger.debug("%s (JSON): %s", label, json.dumps(summary, default=str))
    return summary


def console_script(
    main: Callable[[list[str]], object], name: str, resumes: str | None = None
) -> Callable[[], None]:
    """The ``run()`` of a job: the console script ``name`` and the ``__main__`` block of
    ``jobs/*.py``: ``main``, a config error printed as one line naming the file and key, exit 2,
    Ctrl-C one line saying what a rerun does (``resumes``), exit 130
    (:func:`raycompat.cli.errors.run_main`)."""

    def run() -> None:
        from raycompat.cli.errors import RESTARTS, run_main

        run_main(main, resumes=resumes or RESTARTS)

    run.__doc__ = f"The console script ``{name}``: :func:`main` run by ``run_main``."
    return run
