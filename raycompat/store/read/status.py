"""What is being written to a store now (``raycompat status``), read from it and never written.

Two kinds of lease say it (``lease.py``): each staging area of a version not yet published,
``<gallery>/_data/<version>/<staging>/_lease/``, and each job lease the caller names (the
upgrade job's, ``upgrade/lock.py``). For each, the newest generation's holder (its
:class:`~raycompat.store.commit.lease.LeaseOwner`: Ray submission id, host, pid, OS user), its
generation, last heartbeat, age and expiry, and a state:

- ``running``: unreleased and its heartbeat younger than its timeout (a live writer);
- ``stale``: unreleased but silent past its timeout, or its holder is a dead process on this
  host (the writer died or hangs; a rerun with the same staging name takes it over and resumes);
- ``stopped`` / ``aborted``: released by its writer (a failed run keeps its parts for a rerun;
  an aborted one's are withdrawn);
- ``no lease`` (its lease records are gone) or ``unreadable``.

A staging area's progress is counted from names alone, without reading a part: the part
records under ``_parts/`` (``g<generation>-<hex>.<part>.json``, ``part_record.part_file_name``)
of writers newer than the last abort, against the chunks of the pipeline's plan
(:data:`PLAN_FILE`) when it wrote one. A part counted is one whose record exists: its file may
still be moving into place.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict

import pyarrow.fs as pafs

from raycompat.errors import StoreError
from raycompat.registry import UnknownNameError, did_you_mean
from raycompat.store.commit.lease import (
    LEASE_DIR,
    LeaseRecord,
    aborted_through,
    iso_utc,
    read_newest,
)
from raycompat.store.commit.part_record import PARTS_DIR
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import DATA_DIR, VERSIONS_DIR
from raycompat.store.paths import SAFE_NAME, check_name, join

PLAN_FILE = "_plan.json"  # a pipeline's plan in its staging area (cluster/pipelines/resume.py)
_PART_RECORD = re.compile(r"g(\d+)-[0-9a-f]+\.(.+)\.json")


def store_status(store: GalleryStore, gallery: str | None, jobs: dict[str, str]) -> dict:
    """``{"store", "gallery", "jobs", "staging"}``: the job leases (``jobs``: name -> lease
    folder; one never taken is left out) and the staging areas of unpublished versions of
    ``gallery`` (all galleries when None), each a dict (see the module docstring); plus
    ``"corrupt"``: ``[{"file", "error"}]`` for a lease record or plan that cannot be read.

    Raises:
        UnknownNameError: ``gallery`` is not a folder of the store (lists those that are).
    """
    known = gallery_folders(store)
    if gallery is not None and gallery not in known:
        check_name("gallery", gallery)
        raise UnknownNameError(
            f"no gallery {gallery!r} in {store.uri()}: galleries are "
            f"{', '.join(known) or '(none)'}{did_you_mean(gallery, known)}"
        )
    corrupt: list[dict] = []
    job_rows = [
        {"job": name, **lease_row(store, path, corrupt)} for name, path in sorted(jobs.items())
    ]
    job_rows = [row for row in job_rows if row["state"] != "no lease"]  # never run
    staging_rows = [
        row for g in ([gallery] if gallery else known) for row in _stagings(store, g, corrupt)
    ]
    out = {"store": store.uri(), "gallery": gallery, "jobs": job_rows, "staging": staging_rows}
    return {**out, "corrupt": corrupt} if corrupt else out


def gallery_folders(store: GalleryStore) -> list[str]:
    """Every gallery folder of the store, published or not (sorted)."""
    selector = pafs.FileSelector(store.path(), allow_not_found=True)
    return sorted(
        e.base_name
        for e in store.filesystem.get_file_info(selector)
        if e.type == pafs.FileType.Directory and SAFE_NAME.fullmatch(e.base_name)
    )


def _folders(store: GalleryStore, path: str) -> list[str]:
    selector = pafs.FileSelector(path, allow_not_found=True)
    return sorted(
        e.base_name
        for e in store.filesystem.get_file_info(selector)
        if e.type == pafs.FileType.Directory and not e.base_name.startswith(("_", "."))
    )


def _stagings(store: GalleryStore, gallery: str, corrupt: list[dict]) -> list[dict]:
    """One row per staging area of each unpublished version of ``gallery``."""
    rows = []
    for version in _folders(store, store.path(gallery, DATA_DIR)):
        record = store.path(gallery, VERSIONS_DIR, f"{version}.json")
        if store.filesystem.get_file_info(record).type != pafs.FileType.NotFound:
            continue  # published: its staging area is the version (or gc's to reclaim)
        for staging in _folders(store, store.path(gallery, DATA_DIR, version)):
            path = store.path(gallery, DATA_DIR, version, staging)
            lease = lease_row(store, join(path, LEASE_DIR), corrupt)
            head = {"gallery": gallery, "version": version, "staging": staging}
            rows.append({**head, **lease, **progress(store, path, corrupt)})
    return rows


def lease_row(store: GalleryStore, lease_dir: str, corrupt: list[dict]) -> dict:
    """The newest generation of the lease in ``lease_dir``, as a row (module docstring)."""
    row = {"uri": store.backend.uri(lease_dir.removesuffix("/" + LEASE_DIR))}
    try:
        record = read_newest(store.backend, lease_dir)
    except StoreError as error:
        corrupt.append({"file": store.backend.uri(lease_dir), "error": str(error)})
        return {**row, "state": "unreadable", "holder": None, "by": None, "generation": None}
    if record is None:
        return {**row, "state": "no lease", "holder": None, "by": None, "generation": None}
    return {**row, **_describe(record)}


def _describe(record: LeaseRecord) -> dict:
    if record.released:
        state = "aborted" if record.aborted else "stopped"
    else:
        state = "stale" if record.expired() else "running"
    return {
        "state": state,
        "holder": record.owner.describe(),
        "by": asdict(record.owner),
        "generation": record.generation,
        "heartbeat": iso_utc(record.heartbeat),
        "age_s": round(record.age_s(), 1),
        "timeout_s": record.timeout_s,
        "expires": None if record.released else iso_utc(record.heartbeat + record.timeout_s),
    }


def progress(store: GalleryStore, staging_path: str, corrupt: list[dict]) -> dict:
    """``{"operation", "parts_done", "parts_planned", "rows_done", "rows_planned"}`` of a
    staging area; the planned counts (and ``operation``, the plan's ``kind``) are None
    without a plan."""
    withdrawn = aborted_through(store.backend, join(staging_path, LEASE_DIR))
    selector = pafs.FileSelector(join(staging_path, PARTS_DIR), allow_not_found=True)
    done = set()
    for entry in store.filesystem.get_file_info(selector):
        found = _PART_RECORD.fullmatch(entry.base_name)
        if found and int(found.group(1)) > withdrawn:
            done.add(found.group(2))
    plan = _plan(store, staging_path, withdrawn, corrupt)
    if plan is None:
        unknown = {"rows_done": None, "parts_planned": None, "rows_planned": None}
        return {"operation": None, "parts_done": len(done), **unknown}
    kind, rows = plan
    return {
        "operation": kind,
        "parts_done": len(done & set(rows)),
        "parts_planned": len(rows),
        "rows_done": sum(rows[p] for p in done & set(rows)),
        "rows_planned": sum(rows.values()),
    }


def _plan(store: GalleryStore, staging_path: str, withdrawn: int, corrupt: list[dict]):
    """The plan of the run after the last abort (``Staging.meta_path``), or None (none
    written, or unreadable: then named in ``corrupt``)."""
    folder = join(staging_path, f"_meta-g{withdrawn}") if withdrawn else staging_path
    path = join(folder, PLAN_FILE)
    if store.filesystem.get_file_info(path).type != pafs.FileType.File:
        return None
    try:
        with store.filesystem.open_input_stream(path) as handle:
            plan = json.loads(handle.read())
        chunks = [(c["part"], int(c["stop"]) - int(c["start"])) for c in plan["chunks"]]
        kind = plan["identity"].get("kind")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        corrupt.append({"file": store.backend.uri(path), "error": f"unreadable plan ({error})"})
        return None
    return kind, dict(chunks)
