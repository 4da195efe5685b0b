"""``raycompat report RUN_DIR``: an upgrade run's report (report.md, or report.json with
``--json``); a missing report folder lists the runs beside it (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

from raycompat.cli.command import Command


def report(args) -> dict | str:
    from raycompat.store.read.lookup import choices

    directory = Path(args.run)
    name = "report.json" if args.json else "report.md"
    path = directory / name
    if not path.is_file():
        runs = _report_runs(directory.parent)
        known = f"; {choices(directory.name, runs, f'runs in {directory.parent}')}"
        raise FileNotFoundError(
            f"{path} does not exist: give the report directory of an upgrade run "
            f"(<report_dir>/<name>/, written by jobs/upgrade.py){known if runs else ''}"
        )
    text = path.read_text()
    return json.loads(text) if args.json else text


def _report_runs(folder: Path) -> list[str]:
    """The run folders (holding a report.md) in ``folder``, sorted; none if it is no folder."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / "report.md").is_file())


def _arguments(p) -> None:
    p.add_argument("run", help="the run's report directory, e.g. outputs/upgrade/report/<name>")
    p.add_argument("--json", action="store_true", help="report.json instead of report.md")


COMMANDS = (
    Command(
        "report",
        "show an upgrade run's report",
        _arguments,
        report,
        example="raycompat report outputs/upgrade/report/mnist-history",
        as_json=False,
    ),
)
