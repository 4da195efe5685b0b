"""The ``raycompat`` command and the jobs' shared preamble (entry points, no Ray at import).

``raycompat.cli:main`` is the console script; :mod:`raycompat.cli.app` (imported only when the
command runs) builds its parser from the commands registered in :mod:`raycompat.cli.commands`,
one module per command group.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from raycompat.cli.app import main as run

    return run(argv)


def __getattr__(name: str):
    # The names of the former module ``raycompat.cli`` (now ``raycompat.cli.app``). The import
    # goes through importlib: ``from raycompat.cli import app`` would ask this hook for ``app``.
    import importlib

    app = importlib.import_module("raycompat.cli.app")
    return app if name == "app" else getattr(app, name)
