"""``raycompat promote | rollback | revoke | retire``: which gallery version each model serves.

The handlers write the store's alias log and tombstones (``serving/served_log.py``,
``store/catalog/retired.py``) and answer one line, or the record as JSON with ``--json``. An unknown
gallery or model is a usage error listing those that exist (exit 2); a version the model may
not serve is one too; a retired model, a conflict with a concurrent writer or nothing to roll
back to is a data error (exit 1). Imports stay light: the store loads inside the handlers.
"""

from __future__ import annotations

import argparse

from raycompat.cli.arguments import STORE, add_gallery
from raycompat.cli.command import Command
from raycompat.cli.store_options import add_store_arguments, open_store
from raycompat.cli.tables import change_answer


def promote(args) -> dict | str:
    from raycompat.serving.served_log import promote as promote_alias

    store = open_store(args, gallery=args.gallery)
    record = promote_alias(store, args.gallery, args.model, args.version)
    if record is None:
        return change_answer(
            args, None, f"{args.model} already serves {args.gallery} {args.version}"
        )
    was = record.previous or "nothing"
    how = f"`raycompat rollback {args.gallery} --model {args.model}` returns to {was}"
    line = (
        f"{args.model} serves {args.gallery} {args.version} (was {was}; change {record.seq}; {how})"
    )
    return change_answer(args, record, line)


def rollback(args) -> dict | str:
    from raycompat.serving.served_log import rollback as rollback_alias

    store = open_store(args, gallery=args.gallery)
    record = rollback_alias(store, args.gallery, args.model)
    now = record.gallery_version or "nothing (revoked)"
    was = record.previous or "nothing"
    line = f"{args.model} serves {args.gallery} {now} again (was {was}; change {record.seq})"
    return change_answer(args, record, line)


def revoke(args) -> dict | str:
    from raycompat.serving.served_log import revoke as revoke_alias

    store = open_store(args, gallery=args.gallery)
    record = revoke_alias(store, args.gallery, args.model)
    if record is None:
        return change_answer(args, None, f"{args.model} is already revoked on {args.gallery}")
    line = (
        f"{args.model} no longer serves {args.gallery} (served {record.previous}; change "
        f"{record.seq}); `raycompat rollback` undoes it"
    )
    return change_answer(args, record, line)


def retire(args) -> dict | str:
    from raycompat.store.catalog.models import Catalog
    from raycompat.store.catalog.retired import retire as retire_model
    from raycompat.store.read.lookup import model_record

    store = open_store(args)
    model_record(Catalog(store), args.model)  # an unknown name lists the models (exit 2)
    record = retire_model(store, args.model, args.reason)
    line = f"{record.line()}: it serves no gallery and takes no new grant or promote"
    return change_answer(args, record, line)


# ---- arguments -------------------------------------------------------------------------------


def _model_and_store(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a registered model version, e.g. m2")
    add_store_arguments(p)


def _promote_arguments(p: argparse.ArgumentParser) -> None:
    add_gallery(p, "the gallery whose alias for --model changes")
    p.add_argument(
        "--version",
        required=True,
        help="the gallery version to serve: the model's grant's, or one the model extracted",
    )
    _model_and_store(p)


def _gallery_arguments(p: argparse.ArgumentParser) -> None:
    """``rollback`` and ``revoke``: a gallery, ``--model`` and ``--store``."""
    add_gallery(p, "the gallery the model serves")
    _model_and_store(p)


def _retire_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="the registered model version to retire, e.g. m1")
    add_store_arguments(p)
    p.add_argument("--reason", default="", help="why, kept in the tombstone record")


COMMANDS = (
    Command(
        "promote",
        "serve another version of a gallery with a model, atomically (the previous one is "
        "kept for rollback)",
        _promote_arguments,
        promote,
        # after `make demo`, m1 may serve only v1 (m2 and m3 were refused): the example
        # serves m1's version again after `raycompat revoke mnist --model m1`
        example=f"raycompat promote mnist --model m1 --version v1 --store {STORE}",
        description="serve another version of a gallery with a model, atomically (the previous\n"
        "one is kept for rollback). A model may serve its grant's version or one it\n"
        "extracted; to swap among every compatible (version, query model) pair, point a\n"
        "named alias instead: `raycompat alias set` (docs/store.md, Serving).",
    ),
    Command(
        "rollback",
        "serve again what a model served before its newest promote or revoke",
        _gallery_arguments,
        rollback,
        example=f"raycompat rollback mnist --model m1 --store {STORE}",
    ),
    Command(
        "revoke",
        "stop a model serving a gallery (gc may then reclaim what only it served)",
        _gallery_arguments,
        revoke,
        example=f"raycompat revoke mnist --model m1 --store {STORE}",
    ),
    Command(
        "retire",
        "stop a model serving every gallery, for good: no new grant or promote",
        _retire_arguments,
        retire,
        example=f"raycompat retire m1 --store {STORE} --reason 'replaced by m2'",
    ),
)
