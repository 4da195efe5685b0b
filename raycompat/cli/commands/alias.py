"""``raycompat alias set | rollback | list``: named aliases (``prod``) of a gallery.

A named alias points at a pair (gallery version, query model) and is swapped among the
compatible pairs, the compatibility check as the gate (``serving/aliases.py``,
``serving/compatible_pairs.py``); ``raycompat search G --alias prod`` searches what it points at.
An incompatible pair is a usage error naming the alias, the pair and why (exit 2); an unknown
gallery, version or alias lists those that exist, and a conflict with a concurrent writer or
nothing to roll back to is a data error (exit 1). Imports stay light: the store loads inside
the handlers.
"""

from __future__ import annotations

import argparse

from raycompat.cli.arguments import STORE, add_gallery
from raycompat.cli.command import Command, command_group
from raycompat.cli.store_options import add_store_arguments, open_store
from raycompat.cli.tables import change_answer, table


def _pair(pair: dict | None) -> str:
    return f"({pair['gallery_version']}, {pair['model_version']})" if pair else "nothing"


def set_alias(args) -> dict | str:
    from raycompat.serving.aliases import set_alias as set_named

    store = open_store(args, gallery=args.gallery)
    record = set_named(store, args.gallery, args.name, args.version, args.model)
    pair = f"({args.version}, {args.model})"
    if record is None:
        return change_answer(
            args, None, f"alias {args.name} of {args.gallery} already points at {pair}"
        )
    was = _pair(record.previous)
    back = (
        f"; `raycompat alias rollback {args.gallery} {args.name}` returns to {was}"
        if record.previous
        else ""
    )
    line = (
        f"alias {args.name} of {args.gallery} points at {pair}: {record.why} (was {was}; "
        f"change {record.seq}{back})"
    )
    return change_answer(args, record, line)


def rollback(args) -> dict | str:
    from raycompat.serving.aliases import rollback as rollback_named

    store = open_store(args, gallery=args.gallery)
    record = rollback_named(store, args.gallery, args.name)
    line = (
        f"alias {args.name} of {args.gallery} points at {_pair(record.pair)} again (was "
        f"{_pair(record.previous)}; change {record.seq})"
    )
    return change_answer(args, record, line)


def list_aliases(args) -> dict:
    from raycompat.serving.aliases import log, names, reachable

    store = open_store(args, gallery=args.gallery)
    rows = []
    for name in names(store, args.gallery):
        records = log(store, args.gallery, name)
        now, chain = reachable(records)
        if now is None:  # a folder without records: nothing was ever set
            continue
        rows.append(
            {
                "alias": name,
                **now,
                "relation": records[-1].relation,
                "change": records[-1].seq,
                "rollback_to": _pair(chain[0]) if chain else None,
                "created": records[-1].created,
                "by": records[-1].by,
            }
        )
    return {"gallery": args.gallery, "aliases": rows}


COLUMNS = [
    ("alias", "alias"),
    ("gallery_version", "version"),
    ("model_version", "model"),
    ("relation", "relation"),
    ("change", "change"),
    ("rollback_to", "rollback to"),
    ("created", "created"),
]


def render(out: dict) -> str:
    """``alias list``'s table (set and rollback answer one line, or JSON)."""
    if not out["aliases"]:
        return f"gallery {out['gallery']} has no named alias (raycompat alias set makes one)"
    return table(out["aliases"], COLUMNS)


# ---- arguments -------------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser, name_help: str | None) -> None:
    add_gallery(p)
    if name_help:
        p.add_argument("name", help=name_help)
    add_store_arguments(p)
    p.add_argument("--json", action="store_true", help="JSON instead of a line or a table")


def _set_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, "the alias, e.g. prod or staging (created by its first set)")
    p.add_argument("--version", required=True, help="the gallery version the alias points at")
    p.add_argument(
        "--model",
        required=True,
        help="the query model whose queries search it: the version's own model, one granted "
        "the version, or one that passed the compatibility criterion against its model",
    )


def _rollback_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, "the alias to roll back")


def _list_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, None)


ACTIONS = (
    Command(
        "set",
        "point a named alias at (version, query model), if the model may search the version",
        _set_arguments,
        set_alias,
        example=f"raycompat alias set mnist prod --version v2 --model m2 --store {STORE}",
    ),
    Command(
        "rollback",
        "point a named alias again at the pair it pointed at before its newest change",
        _rollback_arguments,
        rollback,
        example=f"raycompat alias rollback mnist prod --store {STORE}",
    ),
    Command(
        "list",
        "a gallery's named aliases: what each points at and would roll back to",
        _list_arguments,
        list_aliases,
        example=f"raycompat alias list mnist --store {STORE} --json",
    ),
)
COMMANDS = (
    command_group(
        "alias",
        "named aliases (prod, staging): point one at a compatible (version, query model) pair, "
        "roll it back, list them",
        ACTIONS,
        render=render,
        description="point named aliases (prod, staging) at compatible (version, query model)\n"
        "pairs, roll them back, list them; `raycompat search G --alias prod` searches what\n"
        "one points at (docs/store.md, Serving)",
    ),
)
