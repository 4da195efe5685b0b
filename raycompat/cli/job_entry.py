"""The preamble every job in ``jobs/`` shares: its arguments, its config, where its outputs go.

    parser = job_parser(__doc__, "UpgradeConfig")
    args = parser.parse_args(argv)
    cfg = job_config(UpgradeConfig, args, default=UPGRADE_DEFAULT, outputs=("store.root",))
    ...  # the job's own checks
    announce_outputs(cfg, ("store.root",))  # "outputs: store.root=/abs/store"

- ``--config FILE`` and ``key.sub=value`` overrides (list entries too: ``upgrades.0.epochs=1``
  or ``upgrades[0].epochs=1``); without ``--config`` the job says which default it runs.
- ``--print-config`` prints the merged, validated config (credentials redacted) and exits 0.
- Outputs never land in Ray's temporary copy of the working dir: a job started by
  ``ray job submit --working-dir`` runs inside that copy, which Ray deletes, so a relative local
  output path there is refused with one line saying what to pass, unless ``--output-root DIR``
  (or ``RAYCOMPAT_OUTPUT_ROOT``) resolves relative outputs against ``DIR``. The job logs
  where its outputs go before it starts (:func:`announce_outputs`).

This module imports neither torch nor Ray: ``--help``, ``--print-config`` and a config typo
answer before either loads.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from raycompat.cli.job_exit import JOB_CONFIG_ENV  # Ray's job supervisor sets it
from raycompat.config import dump_config, load_config
from raycompat.errors import ConfigError

C = TypeVar("C")
log = logging.getLogger("raycompat.jobs")
OUTPUT_ROOT_ENV = "RAYCOMPAT_OUTPUT_ROOT"


def job_parser(
    doc: str, config_type: str, *, address: bool = True, default: str | None = None
) -> argparse.ArgumentParser:
    """The arguments every job takes (``address``: whether it has ``--address``; ``default``:
    what the job runs without ``--config``, named in ``--help``)."""
    parser = argparse.ArgumentParser(
        description=doc.splitlines()[0],
        epilog="Overrides reach list entries: upgrades.0.epochs=1 (or upgrades[0].epochs=1).",
    )
    without = f"without it: {default}" if default else "without it the job runs its defaults"
    parser.add_argument("--config", help=f"YAML file with {config_type} keys ({without})")
    if address:
        parser.add_argument("--address", default=None, help="Ray address (default: start or join)")
    parser.add_argument(
        "--verbose", action="store_true", help="show Ray's progress lines and our debug lines"
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the merged, validated config (credentials redacted) and exit",
    )
    parser.add_argument(
        "--output-root",
        default=os.environ.get(OUTPUT_ROOT_ENV),
        help=f"resolve relative local output paths against this folder (env {OUTPUT_ROOT_ENV}); "
        "needed for relative paths under `ray job submit --working-dir`",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (RAYCOMPAT_DEBUG=1)"
    )
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. epochs=2")
    return parser


def job_config(
    cls: type[C], args: argparse.Namespace, *, default: str, outputs: tuple[str, ...] = ()
) -> C:
    """Load ``cls`` from ``args``; handle ``--print-config`` (prints, then ``SystemExit(0)``)
    and the output paths named by ``outputs`` (dotted keys, see :func:`resolve_outputs`)."""
    if args.config is None:
        log.info("no --config given: running %s", default)
    cfg = load_config(cls, args.config, args.overrides)
    cfg = resolve_outputs(cfg, outputs, args.output_root)
    if args.print_config:
        print(dump_config(cfg), end="")
        raise SystemExit(0)
    return cfg


def announce_outputs(cfg: Any, outputs: tuple[str, ...]) -> None:
    """Log where the job's outputs go (after its checks, so that a config error stays the
    only line a failing job prints)."""
    log.info("outputs: %s", ", ".join(f"{key}={_get(cfg, key)}" for key in outputs))


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


def submitted_working_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Ray's temporary copy of the working dir this process runs in (a job submitted with a
    ``working_dir``), or None."""
    raw = (os.environ if environ is None else environ).get(JOB_CONFIG_ENV)
    if not raw:
        return None
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return None
    return os.getcwd() if runtime_env.get("working_dir") else None


def resolve_outputs(
    cfg: C, keys: tuple[str, ...], output_root: str | None, environ: Mapping[str, str] | None = None
) -> C:
    """Make the local output paths named by ``keys`` absolute against ``output_root``; without
    one, refuse a relative path when the job runs in Ray's temporary working-dir copy."""
    copy = submitted_working_dir(environ)
    for key in keys:
        value = _get(cfg, key)
        if not isinstance(value, str) or not value or "://" in value or os.path.isabs(value):
            continue
        if output_root:
            _set(cfg, key, os.path.abspath(os.path.join(output_root, value)))
        elif copy is not None:
            raise ConfigError(
                f"{key}={value!r} is relative, and this job runs in Ray's temporary copy of "
                f"its working dir ({copy}), which Ray deletes: pass an absolute path or s3:// "
                f"URI ({key}=/shared/...), or --output-root DIR (env {OUTPUT_ROOT_ENV})"
            )
    return cfg


def _get(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _set(cfg: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    setattr(_get(cfg, ".".join(parents)) if parents else cfg, last, value)
