"""Every ``raycompat`` subcommand, one module per group, each command one
:class:`~raycompat.cli.command.Command`:

    store.py        galleries, versions, models      what a store holds
    history.py      history                          a gallery's story
    status.py       status                           leases, running upgrades, progress
    search.py       search                           top-k ids for images, vectors or ids
    index.py        index build | verify             a version's faiss index
    promotion.py    promote, rollback, revoke,       which version each model serves
                    retire
    service.py      serve                            the search service (HTTP, uvicorn)
    alias.py        alias set | rollback | list      named aliases: (version, model) pairs
    adapt.py        adapt                            a query-side map fitted on paired rows
    formats.py      adopt, export                    Delta, Iceberg and Parquet tables
    maintenance.py  gc, mark-store                   reclaim what no record names
    report.py       report                           an upgrade run's report

:data:`REGISTRY` holds them by name, in this order (``raycompat --help`` lists them so). Each
module imports only light modules at its top: torch, Ray and faiss load inside the handlers.
"""

from __future__ import annotations

from raycompat.cli.command import Command
from raycompat.cli.commands import (
    adapt,
    alias,
    formats,
    history,
    index,
    maintenance,
    promotion,
    report,
    search,
    service,
    status,
    store,
)

GROUPS = (
    store, history, status, search, index, promotion, service, alias, adapt, formats,
    maintenance, report,
)  # fmt: skip


def _registry() -> dict[str, Command]:
    registry: dict[str, Command] = {}
    for group in GROUPS:
        for command in group.COMMANDS:
            if command.name in registry:
                raise ValueError(f"two commands named {command.name!r} ({group.__name__})")
            registry[command.name] = command
    return registry


REGISTRY = _registry()
