"""The ``raycompat`` command and the jobs' shared preamble (entry points, no Ray at import).

``raycompat.cli:main`` is the console script; :mod:`raycompat.cli.app` (imported only when the
command runs) builds its parser from the commands registered in :mod:`raycompat.cli.commands`,
one module per command group. The jobs' recipes are :mod:`raycompat.cli.jobs`; their console
scripts run each ``main`` under :func:`run_main` (one-line errors).
"""

from __future__ import annotations

from raycompat.cli.errors import run_main

__all__ = ["main", "run_main"]


def main(argv: list[str] | None = None) -> int:
    from raycompat.cli.app import main as run

    return run(argv)
