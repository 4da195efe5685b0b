"""``raycompat status [GALLERY]``: what is being written to a store now.

The upgrade jobs holding a gallery's job lease, and every staging area of an unpublished
version: who holds its lease (Ray submission id, host, pid, OS user), the generation, the last
heartbeat and when the lease expires, its state (running, stale, stopped, aborted) and its
progress (parts and rows written of those planned). ``store/read/status.py`` reads it; nothing is
written. Without GALLERY, every gallery of the store.
"""

from __future__ import annotations

from raycompat.cli.arguments import STORE
from raycompat.cli.command import Command
from raycompat.cli.store_options import add_store_arguments, open_store
from raycompat.cli.tables import corrupt_lines, table


def status(args) -> dict:
    from raycompat.store.read.status import gallery_folders, store_status
    from raycompat.upgrade.lock import lease_dir

    store = open_store(args)
    galleries = [args.gallery] if args.gallery else gallery_folders(store)
    jobs = {f"upgrade {g}": lease_dir(store, g) for g in galleries}
    return store_status(store, args.gallery, jobs)


def _progress(row: dict) -> str:
    """``3/8 parts, 3,000/8,000 rows``; ``3 parts`` without a plan."""
    if row["parts_planned"] is None:
        return f"{row['parts_done']} parts"
    return (
        f"{row['parts_done']}/{row['parts_planned']} parts, "
        f"{row['rows_done']:,}/{row['rows_planned']:,} rows"
    )


JOBS = [
    ("job", "job"),
    ("state", "state"),
    ("generation", "gen"),
    ("age_s", "age s"),
    ("expires", "expires"),
    ("holder", "holder"),
]
STAGING = [
    ("gallery", "gallery"),
    ("version", "version"),
    ("staging", "staging"),
    ("operation", "operation"),
    ("state", "state"),
    ("progress", "progress"),
    ("generation", "gen"),
    ("age_s", "age s"),
    ("expires", "expires"),
    ("holder", "holder"),
]


def _seconds(row: dict) -> dict:
    """The lease's age in whole seconds (the last heartbeat's, ``age_s``)."""
    age = row.get("age_s")
    return {**row, "age_s": None if age is None else int(round(age))}


def render_status(out: dict) -> str:
    jobs = [_seconds(j) for j in out["jobs"]]
    staging = [_seconds({**s, "progress": _progress(s)}) for s in out["staging"]]
    running = sum(r["state"] == "running" for r in jobs + staging)
    sections = [
        f"store {out['store']}: {running} running",
        "upgrade jobs\n" + (table(jobs, JOBS, uncut=["holder"]) if jobs else "none"),
        "staging areas of unpublished versions\n"
        + (table(staging, STAGING, uncut=["holder"]) if staging else "none"),
    ]
    return "\n\n".join(sections) + corrupt_lines(out)


def _arguments(p) -> None:
    p.add_argument(
        "gallery", nargs="?", default=None, help="only this gallery (default: every gallery)"
    )
    add_store_arguments(p)


COMMANDS = (
    Command(
        "status",
        "what is being written now: running upgrade jobs and staging areas, who holds each "
        "lease (Ray submission id, host, user), when it expires, and parts written of planned",
        _arguments,
        status,
        render_status,
        example=f"raycompat status mnist --store {STORE}",
    ),
)
