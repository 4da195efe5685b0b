"""``raycompat gc | mark-store``: reclaim what no record names, in a marked store only.

``gc`` lists (``--dry-run``) or deletes what :mod:`raycompat.store.maintenance.gc` finds, and
says what it keeps and why; what each gallery's live models serve comes from the serving layer
(``serving/serving_map.py``), handed to gc here. It refuses an unmarked folder (exit 2).
``mark-store`` marks a store written before store markers (``store/maintenance/marker.py``) so
gc may manage it. See docs/store.md.
"""

from __future__ import annotations

from raycompat.cli.arguments import STORE, duration_s
from raycompat.cli.command import Command
from raycompat.cli.store_options import STORE_HELP, add_store_arguments, open_store
from raycompat.cli.tables import table
from raycompat.store.maintenance.retention import DEFAULT_RETENTION_S


def gc(args) -> dict:
    from functools import partial

    from raycompat.serving.serving_map import serving_map
    from raycompat.store.maintenance.gc import collect, make_plan

    store = open_store(args)
    served = partial(serving_map, store)  # read per gallery while planning
    plan = make_plan(store, args.older_than, args.keep_versions, served=served)
    items = plan.items
    freed = 0 if args.dry_run else collect(store, items)
    return {
        "store": args.store,
        "dry_run": args.dry_run,
        "items": [
            {"kind": i.kind, "uri": i.uri, "reason": i.reason, "bytes": i.bytes} for i in items
        ],
        "kept": [{"kind": k.kind, "what": k.what, "reason": k.reason} for k in plan.kept],
        "bytes": sum(i.bytes for i in items),
        "bytes_freed": freed,
    }


GC_COLUMNS = [("kind", "kind"), ("bytes", "bytes"), ("reason", "reason"), ("uri", "path")]
GC_UNCUT = ("reason", "uri")  # a path is copied into a shell: printed whole, however long


def render_gc(out: dict) -> str:
    verb = "would remove" if out["dry_run"] else "removed"
    body = table(out["items"], GC_COLUMNS, GC_UNCUT) if out["items"] else "nothing to remove"
    if out["dry_run"]:  # what is kept, and why: one line each
        body += "".join(f"\nkeep {k['what']}: {k['reason']}" for k in out.get("kept", []))
    return f"{body}\n{verb} {len(out['items'])} item(s), {out['bytes']:,} bytes"


def _gc_arguments(p) -> None:
    add_store_arguments(p, STORE_HELP + " (a marked one)")
    p.add_argument(
        "--older-than",
        type=duration_s,
        default=None,
        help="only what is older than this (8d, 36h or seconds; default and minimum: the "
        "store's retention, set in its marker when it was created, "
        f"{DEFAULT_RETENTION_S / 86400:g}d unless chosen then)",
    )
    p.add_argument(
        "--keep-versions",
        type=int,
        default=None,
        help="also remove published versions older than the newest K, unless a registered "
        "model queries them or the newest version's lineage names them",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would go and what is kept, with reasons; delete nothing",
    )


def mark_store(args) -> str:
    """Refuses a folder holding no version record and no model catalog unless ``--force``."""
    from raycompat.errors import MissingStoreError
    from raycompat.store.maintenance.marker import (
        MARKER_NAME,
        galleries_with_records,
        read_marker,
        register_gallery,
        store_contents,
    )

    store = open_store(args, must_exist=False)
    uri = store.uri()
    marker = read_marker(store.backend)
    if marker is None:
        found = store_contents(store.backend)
        if not found and not args.force:
            raise MissingStoreError(
                f"{uri} holds no gallery record (*/_versions/*.json) and no model catalog "
                f"(_models/*.json), so it does not look like a store; not marked (--force "
                f"marks it)"
            )
        store.mark()
    # galleries written before gallery records existed: gc manages only registered ones
    added = [g for g in galleries_with_records(store.backend) if register_gallery(store.backend, g)]
    registered = f"; registered galleries: {', '.join(added)}" if added else ""
    if marker is not None:
        return f"{uri} is already marked ({marker.format}, created {marker.created}){registered}"
    return (
        f"marked {uri} as a raycompat store ({MARKER_NAME}): {', '.join(found) or 'empty'}"
        f"{registered}"
    )


def _mark_store_arguments(p) -> None:
    add_store_arguments(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="mark it even if it holds no version record and no model catalog yet",
    )


COMMANDS = (
    Command(
        "gc",
        "remove abandoned staging areas, stale temporary files, old index builds and "
        "(with --keep-versions) superseded versions",
        _gc_arguments,
        gc,
        render_gc,
        example=f"raycompat gc --store {STORE} --keep-versions 2 --dry-run",
        resumes="rerunning the same command collects what is left",
    ),
    Command(
        "mark-store",
        "mark a store written before store markers, so gc may manage it",
        _mark_store_arguments,
        mark_store,
        example="raycompat mark-store --store s3://bucket/raycompat/store",
        as_json=False,
    ),
)
