"""An upgrade run's report folder is never changed silently.

- A rerun that published nothing new (every entry of the history resumed or skipped) leaves the
  report already there byte for byte as it was (:func:`has_report` tells the job there is one).
- A run that did something moves the earlier report's files into ``earlier/<UTC time it was
  written>/`` beside the new one before writing it (:func:`archive`): the old report can still
  be read, and none of its files (a plot of a section the new report lacks) stays behind
  looking like part of the new one.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

EARLIER = "earlier"
MARKDOWN = "report.md"


def has_report(directory: str | Path) -> bool:
    return (Path(directory) / MARKDOWN).is_file()


def archive(directory: str | Path) -> Path | None:
    """Move the files of the report in ``directory`` (if any) into ``earlier/<stamp>/`` and
    return that folder; the stamp is the UTC time its ``report.md`` was written."""
    out = Path(directory)
    if not has_report(out):
        return None
    written = datetime.fromtimestamp((out / MARKDOWN).stat().st_mtime, UTC)
    stamp = written.strftime("%Y%m%dT%H%M%SZ")
    target, n = out / EARLIER / stamp, 1
    while target.exists():  # two reports written within the same second
        n += 1
        target = out / EARLIER / f"{stamp}-{n}"
    target.mkdir(parents=True)
    for path in sorted(out.iterdir()):
        if path.is_file():
            os.replace(path, target / path.name)
    return target
