"""A job run by a Python that lacks raycompat's requirements: one line that says which Python
and what to do, instead of a ``ModuleNotFoundError`` traceback.

``ray job submit ... -- python jobs/upgrade.py`` runs ``python`` as found on the PATH that
``ray start`` had; started outside the venv, that is the system's Python, which has no Ray,
torch or pyarrow (docs/cluster.md, "Which Python runs the job"; issue 52, item 5b). The
jobs' imports fail in two places, and both say the same line: a job module's own imports
(``jobs/*.py`` load it through :func:`job_module`) and the imports inside its ``main``
(``raycompat.cli.errors.run_main``). Standard library only: it must import where nothing
else does.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module
from types import ModuleType

FIX = (
    "run it with the Python raycompat is installed in (for `ray job submit`: "
    "`source .venv/bin/activate` before `ray start` and `ray job submit`; docs/cluster.md, "
    '"Which Python runs the job")'
)


def missing_requirement(error: ModuleNotFoundError) -> str | None:
    """The one-line message for a requirement this Python cannot import (``error.name``: the
    module), or None where the missing module is raycompat's own (a bug: its traceback)."""
    name = error.name or ""
    if not name or name.split(".")[0] == "raycompat":
        return None
    return f"this Python ({sys.executable}) cannot import {name}, which raycompat needs: {FIX}"


def exit_if_missing(error: ModuleNotFoundError, prog: str) -> None:
    """Where ``error`` is a requirement this Python lacks: ``<prog>: error: <why and what to
    do>`` on stderr and exit status 2. Returns where it is raycompat's own (the caller
    re-raises it: a bug keeps its traceback)."""
    message = missing_requirement(error)
    if message is not None:
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


def job_module(name: str) -> ModuleType:
    """``raycompat.cli.jobs.<name>``, imported for ``jobs/<name>.py``; where this Python lacks
    a requirement, one line and exit status 2 (:func:`exit_if_missing`)."""
    try:
        return import_module(f"raycompat.cli.jobs.{name}")
    except ModuleNotFoundError as error:
        exit_if_missing(error, os.path.basename(sys.argv[0]) or f"{name}.py")
        raise
