"""A gallery's story for an operator (``raycompat history``), read from the store and never
written to it.

Three sections, each oldest first:

- **versions**: what each published version holds (model, rows, width, dtype, lineage), when it
  was created, the operation that made it and its parameters (``operation``: ``"transform"``,
  ``parameters``: ``{"source": "faces/v1@...", "h": <digest>, ...}``, as Delta's ``DESCRIBE
  HISTORY`` gives them; None in records older than that), who wrote it (``by``, the record's
  writer: Ray submission id, host, pid, OS user; for a record older than that, the owner of
  the newest lease generation of each staging area it lists, ``_data/<v>/<staging>/_lease/``,
  or ``"unknown"`` once gc removed it, or for an unreadable lease), and for an adopted version
  its external root and table snapshot (``external.table``, e.g. ``{"format": "delta",
  "version": 3}``);
- **decisions**: every recorded attempt under ``_decisions/<model>/`` (``decisions.py``),
  refused and failed ones with their reasons, which attempt stands, and who recorded it
  (``by``);
- **grants**: which model may query which version, the relation and its evidence
  (``catalog.py``).

A corrupt record is listed under ``corrupt`` (file and error) instead of hiding the rest.
"""

from __future__ import annotations

from dataclasses import asdict

import pyarrow.fs as pafs

from raycompat.errors import StoreError
from raycompat.registry import UnknownNameError, did_you_mean
from raycompat.store.catalog.decisions import DECISIONS_DIR, Decisions, standing
from raycompat.store.catalog.models import Catalog
from raycompat.store.commit.lease import LEASE_DIR, UNKNOWN, LeaseOwner, read_newest
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import DATA_DIR, VersionInfo
from raycompat.store.paths import SAFE_NAME, check_name


def gallery_history(store: GalleryStore, gallery: str) -> dict:
    """``{"gallery", "versions", "decisions", "grants"}`` (lists of dicts, oldest first), plus
    ``"corrupt"``: ``[{"file", "error"}]`` when a record could not be read.

    Raises:
        UnknownNameError: ``gallery`` has no version and no decision; lists those that exist.
    """
    check_gallery(store, gallery)
    infos, corrupt = store.versions_report(gallery)
    grants, bad_grants = Catalog(store).grants_report(gallery)
    decisions, bad_decisions = decision_rows(store, gallery)
    out = {
        "gallery": gallery,
        "versions": [version_row(store, gallery, info) for info in infos],
        "decisions": decisions,
        "grants": [asdict(g) for g in grants],
    }
    bad = corrupt + bad_grants + bad_decisions
    if bad:
        out["corrupt"] = [{"file": uri, "error": error} for uri, error in bad]
    return out


def check_gallery(store: GalleryStore, gallery: str) -> None:
    """Raise :class:`UnknownNameError` (a usage error) naming the store's galleries and the
    nearest name, unless ``gallery`` has a published version or a recorded decision."""
    check_name("gallery", gallery)
    known = sorted(set(store.galleries()) | set(_decided_galleries(store)))
    if gallery in known:
        return
    raise UnknownNameError(
        f"no gallery {gallery!r} in {store.uri()}: galleries are "
        f"{', '.join(known) or '(none)'}{did_you_mean(gallery, known)}"
    )


def _decided_galleries(store: GalleryStore) -> list[str]:
    """Galleries holding a ``_decisions/`` folder (a gallery whose every upgrade failed)."""
    selector = pafs.FileSelector(store.path(), allow_not_found=True)
    names = [
        e.base_name
        for e in store.filesystem.get_file_info(selector)
        if e.type == pafs.FileType.Directory and SAFE_NAME.fullmatch(e.base_name)
    ]
    return [g for g in names if _is_dir(store, store.path(g, DECISIONS_DIR))]


def _is_dir(store: GalleryStore, path: str) -> bool:
    return store.filesystem.get_file_info(path).type == pafs.FileType.Directory


def version_row(store: GalleryStore, gallery: str, info: VersionInfo) -> dict:
    """One version: its record's fields, ``operation``, ``parameters``, ``written_by`` (one line
    per writer), ``by`` (the record's writer as a dict, None in older records) and, if adopted,
    ``external``."""
    external = None
    if info.external is not None:
        external = {"root": info.external["root"], "table": info.external.get("table")}
    return {
        "version": info.version,
        "created": info.created,
        "model_version": info.model_version,
        "rows": info.rows,
        "width": info.width,
        "dtype": info.dtype,
        "lineage": info.lineage,
        "operation": info.operation,
        "parameters": info.parameters,
        "written_by": writers(store, gallery, info),
        "by": info.by,
        "external": external,
    }


def writers(store: GalleryStore, gallery: str, info: VersionInfo) -> list[str]:
    """Who wrote the version: the writer its record names (``by``); for an older record, the
    newest lease generation's owner of each staging area whose files it lists, or
    ``["unknown"]`` when none is left (gc, adopted, unreadable)."""
    if info.by is not None:
        return [describe(info.by)]
    if info.external is not None:
        return [UNKNOWN]
    stagings = []
    for rel in info.files:  # _data/<version>/<staging>/<part file>
        parts = rel.split("/")
        if len(parts) >= 4 and parts[:2] == [DATA_DIR, info.version] and parts[2] not in stagings:
            stagings.append(parts[2])
    found = []
    for staging in stagings:
        lease_dir = store.path(gallery, DATA_DIR, info.version, staging, LEASE_DIR)
        try:
            record = read_newest(store.backend, lease_dir)
        except (StoreError, OSError):
            record = None
        who = UNKNOWN if record is None else record.owner.describe()
        if who not in found:
            found.append(who)
    return found or [UNKNOWN]


def describe(by: dict | None, short: bool = False) -> str:
    """A record's ``by`` in words (``job 'walk-up-1' on host 'vm' (pid 7) as user 'ana'``, or
    ``short``: ``walk-up-1 (ana@vm)``); ``"unknown"`` when the record has none or it cannot be
    read."""
    try:
        owner = None if by is None else LeaseOwner.from_dict(by)
    except TypeError:
        owner = None
    if owner is None:
        return UNKNOWN
    return owner.short() if short else owner.describe()


def decision_rows(store: GalleryStore, gallery: str) -> tuple[list[dict], list[tuple[str, str]]]:
    """Every decision attempt of every model (oldest first), each with ``standing`` (whether
    a rerun acts on it), and ``(uri, error)`` for each model whose attempts cannot be read."""
    decisions, rows, corrupt = Decisions(store), [], []
    for model in _decided_models(store, gallery):
        try:
            attempts = decisions.attempts(gallery, model)
        except StoreError as error:
            corrupt.append((store.uri(gallery, DECISIONS_DIR, model), str(error)))
            continue
        stands = standing(attempts)
        rows += [
            {**asdict(a), "standing": a is stands, "recorded_by": describe(a.by, short=True)}
            for a in attempts
        ]
    rows.sort(key=lambda r: (r["created"], r["model_version"], r["attempt"]))
    return rows, corrupt


def _decided_models(store: GalleryStore, gallery: str) -> list[str]:
    """Models with a ``_decisions/<model>/`` folder or a pre-attempt ``<model>.json``."""
    selector = pafs.FileSelector(store.path(gallery, DECISIONS_DIR), allow_not_found=True)
    names = set()
    for entry in store.filesystem.get_file_info(selector):
        name = entry.base_name
        if entry.type == pafs.FileType.File and name.endswith(".json"):
            name = name.removesuffix(".json")
        elif entry.type != pafs.FileType.Directory:
            continue
        if SAFE_NAME.fullmatch(name):
            names.add(name)
    return sorted(names)
