"""``raycompat promote | rollback | revoke | retire``: which gallery version each model serves.

Each command's arguments, its ``--help`` line and example (:data:`SPECS`, one entry per
``SUBCOMMANDS`` line in ``arguments.py``) and its handler (one ``COMMANDS`` line in ``app.py``).
The handlers write the store's alias log and tombstones (``store/aliases.py``,
``store/retired.py``) and answer one line, or the record as JSON with ``--json``. An unknown
gallery or model is a usage error listing those that exist (exit 2); a version the model may
not serve is one too; a retired model, a conflict with a concurrent writer or nothing to roll
back to is a data error (exit 1). Imports stay light: the store loads inside the handlers.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

STORE = "outputs/upgrade/store"  # the examples' store: what `python jobs/upgrade.py` writes


def _store_and_model(p: argparse.ArgumentParser) -> None:
    from raycompat.cli.arguments import add_store_arguments  # arguments.py imports this module

    p.add_argument("--model", required=True, help="a registered model version, e.g. m2")
    add_store_arguments(p)


def promote_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("gallery", help="the gallery whose alias for --model changes")
    p.add_argument(
        "--version",
        required=True,
        help="the gallery version to serve: the model's grant's, or one the model extracted",
    )
    _store_and_model(p)


def gallery_arguments(p: argparse.ArgumentParser) -> None:
    """``rollback`` and ``revoke``: a gallery, ``--model`` and ``--store``."""
    p.add_argument("gallery", help="the gallery the model serves")
    _store_and_model(p)


def retire_arguments(p: argparse.ArgumentParser) -> None:
    from raycompat.cli.arguments import add_store_arguments

    p.add_argument("model", help="the registered model version to retire, e.g. m1")
    add_store_arguments(p)
    p.add_argument("--reason", default="", help="why, kept in the tombstone record")


SPECS = {
    "promote": {
        "help": "serve another version of a gallery with a model, atomically (the previous "
        "one is kept for rollback)",
        "add_arguments": promote_arguments,
        "example": f"raycompat promote mnist --model m2 --version v2 --store {STORE}",
    },
    "rollback": {
        "help": "serve again what a model served before its newest promote or revoke",
        "add_arguments": gallery_arguments,
        "example": f"raycompat rollback mnist --model m2 --store {STORE}",
    },
    "revoke": {
        "help": "stop a model serving a gallery (gc may then reclaim what only it served)",
        "add_arguments": gallery_arguments,
        "example": f"raycompat revoke mnist --model m1 --store {STORE}",
    },
    "retire": {
        "help": "stop a model serving every gallery, for good: no new grant or promote",
        "add_arguments": retire_arguments,
        "example": f"raycompat retire m1 --store {STORE} --reason 'replaced by m2'",
    },
}


def _open(args, gallery: str | None = None):
    """The store at ``--store`` (MissingStoreError, exit 2, when there is none), with
    ``gallery`` checked to exist (NotInStoreError listing the galleries, exit 1)."""
    from raycompat.cli.app import open_store  # app.py imports this module
    from raycompat.store.lookup import check_gallery

    store = open_store(args)
    if gallery is not None:
        check_gallery(store, gallery)
    return store


def _answer(args, record, line: str) -> dict | str:
    if not args.json:
        return line
    return {"changed": record is not None, "record": asdict(record) if record else None}


def promote(args) -> dict | str:
    from raycompat.store.aliases import promote as promote_alias

    store = _open(args, args.gallery)
    record = promote_alias(store, args.gallery, args.model, args.version)
    if record is None:
        return _answer(args, None, f"{args.model} already serves {args.gallery} {args.version}")
    was = record.previous or "nothing"
    how = f"`raycompat rollback {args.gallery} --model {args.model}` returns to {was}"
    line = (
        f"{args.model} serves {args.gallery} {args.version} (was {was}; change {record.seq}; {how})"
    )
    return _answer(args, record, line)


def rollback(args) -> dict | str:
    from raycompat.store.aliases import rollback as rollback_alias

    store = _open(args, args.gallery)
    record = rollback_alias(store, args.gallery, args.model)
    now = record.gallery_version or "nothing (revoked)"
    was = record.previous or "nothing"
    line = f"{args.model} serves {args.gallery} {now} again (was {was}; change {record.seq})"
    return _answer(args, record, line)


def revoke(args) -> dict | str:
    from raycompat.store.aliases import revoke as revoke_alias

    store = _open(args, args.gallery)
    record = revoke_alias(store, args.gallery, args.model)
    if record is None:
        return _answer(args, None, f"{args.model} is already revoked on {args.gallery}")
    line = (
        f"{args.model} no longer serves {args.gallery} (served {record.previous}; change "
        f"{record.seq}); `raycompat rollback` undoes it"
    )
    return _answer(args, record, line)


def retire(args) -> dict | str:
    from raycompat.store.lookup import model_record
    from raycompat.store.model_catalog import Catalog
    from raycompat.store.retired import retire as retire_model

    store = _open(args)
    model_record(Catalog(store), args.model)  # an unknown name lists the models (exit 2)
    record = retire_model(store, args.model, args.reason)
    line = f"{record.line()}: it serves no gallery and takes no new grant or promote"
    return _answer(args, record, line)


SERVING_COLUMNS = [("model_version", "model"), ("serves", "serves"), ("source", "from")]
ALIAS_COLUMNS = [
    ("seq", "change"),
    ("model_version", "model"),
    ("action", "action"),
    ("gallery_version", "serves"),
    ("previous", "was"),
    ("created", "created"),
    ("writer", "by"),
]


def serving_sections(out: dict) -> list[str]:
    """``raycompat history``'s "serving" and "alias changes" tables (``store/serving.py``)."""
    from raycompat.cli.tables import table

    if "serving" not in out:
        return []
    serving = table(out["serving"], SERVING_COLUMNS, uncut=["source"]) if out["serving"] else "none"
    changes = out["aliases"]
    aliases = table(changes, ALIAS_COLUMNS, uncut=["writer"]) if changes else "none"
    return ["serving\n" + serving, "alias changes\n" + aliases]
