"""The served-version log: which gallery version each query model serves, switched atomically,
with rollback (``raycompat promote | rollback | revoke``; a model's "alias" in the CLI's words,
as opposed to the named aliases such as ``prod`` of ``aliases.py``).

A model's grant (``store/catalog/models.py``) is immutable. An operator switches what the model
serves with an append-only log per gallery and model, like a table format's branch history::

    <root>/<gallery>/_aliases/<model_version>/00000001.json    an AliasRecord per change

Each record is created with the store's create-if-absent primitive, numbered one past the
newest: of two writers racing for the same number exactly one wins, the other gets
:class:`AliasConflictError` and nothing of its change is written. A record is never rewritten.
A writer that holds a lease (a job) passes its ``LeaseRef``: it is checked just before the write
and recorded in the record; the CLI writes without one (the number is its fence).

- ``promote(g, m, v)``: m serves v from now on. v must be one m may serve (:func:`servable`):
  its grant's version, or a published version whose own model is m.
- ``revoke(g, m)``: m serves nothing on g (``gallery_version`` null).
- ``rollback(g, m)``: undo the newest promote or revoke still standing: m serves again what it
  served before it (``back`` links each record to the state it replaced; 0 is the grant).
- ``current(g, m)``: what m serves: the newest record's version, else its grant (a store
  without a log serves exactly as before); a revoked or retired model
  (``store/catalog/retired.py``) is a one-line :class:`~raycompat.errors.StoreError`.

:func:`raycompat.serving.serving_map.serving_map` gives gc (through its caller) the versions
live models serve or may roll back to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from raycompat.errors import CorruptFileError, StoreError, UsageError
from raycompat.store.catalog.models import Catalog
from raycompat.store.catalog.retired import refuse_retired
from raycompat.store.commit.lease import LeaseOwner, LeaseRef
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import now_utc
from raycompat.store.paths import check_name, join
from raycompat.store.read.lookup import model_record
from raycompat.store.records import check_choice, check_record, load_object

ALIASES_DIR = "_aliases"
ACTIONS = ("promote", "rollback", "revoke")


class AliasConflictError(StoreError):
    """Another writer recorded the same change number first; its change stands, this one is
    not written."""


class RevokedError(StoreError):
    """The model's access to the gallery was revoked (its newest alias serves nothing)."""


class NoRollbackError(StoreError):
    """The model's alias log holds nothing earlier to return to."""


class NotServableError(UsageError, StoreError):
    """The version is not one the model may serve (its grant's, or one of its own): a usage
    error, exit 2."""


@dataclass
class AliasRecord:
    """Change ``seq`` of what ``model_version`` serves on ``gallery``: from here on it serves
    ``gallery_version`` (None: revoked) instead of ``previous``; a rollback returns to the
    state of record ``back`` (0: the grant; None: nothing earlier)."""

    gallery: str
    model_version: str
    seq: int
    action: str
    gallery_version: str | None
    previous: str | None
    back: int | None
    writer: str
    lease: dict = field(default_factory=dict)
    created: str = ""
    by: dict | None = None  # asdict(LeaseOwner) of the writer; None in older records

    @classmethod
    def from_json(cls, data: bytes, source: str) -> AliasRecord:
        raw = load_object(data, source, "alias record")
        check_record(raw, cls, source, "alias record")
        check_choice(raw, "action", ACTIONS, source, "alias record")
        return cls(**raw)


@dataclass(frozen=True)
class Serving:
    """``model_version`` serves ``gallery_version`` of ``gallery``; ``source``: ``"grant"`` or
    ``"alias <seq>"``; ``relation`` as in a grant."""

    gallery: str
    model_version: str
    gallery_version: str
    relation: str
    source: str


def _dir(store: GalleryStore, gallery: str, model: str) -> str:
    return store.path(check_name("gallery", gallery), ALIASES_DIR, check_name("model", model))


def log(store: GalleryStore, gallery: str, model: str) -> list[AliasRecord]:
    """The model's alias records on the gallery, oldest first; a corrupt or missing one raises
    ``CorruptFileError`` naming it (a gap would break the rollback links)."""
    return numbered_log(
        store, _dir(store, gallery, model), AliasRecord.from_json,
        lambda record: (record.gallery, record.model_version), (gallery, model), "alias record",
    )  # fmt: skip


def changes(store: GalleryStore, gallery: str, model: str) -> int:
    """How many changes the model's alias log on the gallery holds: one listing, no record
    read. The log is append-only, so a service that saw the same count saw the same log
    (``raycompat/service/``: its check before each request)."""
    return len(numbered_files(store, _dir(store, gallery, model)))


def checked_stamp(store: GalleryStore, lease: LeaseRef | None, what: str) -> dict:
    """The lease stamp of a record about to be written, the lease checked just before (a lost
    one raises ``LeaseLostError`` naming ``what``); ``{}`` for a writer without a lease."""
    if lease is None:
        return {}
    lease.check(store.backend, what)
    return lease.stamp()


def write_numbered(store: GalleryStore, path: str, record, lost: Callable[[], Exception]) -> None:
    """Create ``record`` (a dataclass) as JSON at ``path``, the next number of an append-only
    log, create-if-absent: when another writer took that number first, raise ``lost()`` (the
    error naming the winner). The store is marked first (gc manages only marked stores,
    ``marker.py``)."""
    store.mark()
    try:
        store.backend.create_exclusive(path, json.dumps(asdict(record), indent=2).encode())
    except FileExistsError:
        raise lost() from None


def numbered_files(store: GalleryStore, directory: str) -> list[tuple[int, str]]:
    """``(number, path)`` of the files ``<number>.json`` of an append-only log, in order: one
    listing, no record read."""
    found = []
    for entry in store.filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
        stem = entry.base_name.removesuffix(".json")
        if entry.type == pafs.FileType.File and entry.base_name.endswith(".json"):
            if stem.isdigit():
                found.append((int(stem), entry.path))
    return sorted(found)


def numbered_log(store: GalleryStore, directory: str, parse, key, expected: tuple, what: str):
    """The records ``00000001.json``, ``00000002.json``... of an append-only log, oldest first,
    each read with ``parse(data, source)``. A gap, or a record whose ``key(record)`` is not
    ``expected`` or whose ``seq`` is not its number, raises ``CorruptFileError`` naming it."""
    fs = store.filesystem
    records = []
    for number, (seq, path) in enumerate(numbered_files(store, directory), start=1):
        source = store.backend.uri(path)
        if seq != number:
            raise CorruptFileError(f"{source}: {what} {number} of this log is missing")
        with fs.open_input_stream(path) as stream:
            record = parse(stream.read(), source)
        if (*key(record), record.seq) != (*expected, seq):
            raise CorruptFileError(f"{source}: the {what} names another log or seq")
        records.append(record)
    return records


def servable(store: GalleryStore, gallery: str, model: str) -> list[str]:
    """The versions ``model`` may serve on ``gallery``: its grant's, and every published
    version whose own model it is, oldest first."""
    grant = Catalog(store).grant_of(gallery, model)
    versions = [grant.gallery_version] if grant else []
    for info in store.versions(gallery):
        if info.model_version == model and info.version not in versions:
            versions.append(info.version)
    return versions


def current(store: GalleryStore, gallery: str, model: str) -> Serving:
    """What ``model`` serves on ``gallery`` (see the module docstring).

    Raises:
        RetiredModelError: the model was retired ("model m2 was retired at <time> ...").
        StoreError: it was revoked on the gallery, or it holds no grant and no alias.
    """
    refuse_retired(store, model, f"query gallery {gallery!r} with it")
    records, catalog = log(store, gallery, model), Catalog(store)
    if not records:
        grant = catalog.queryable_version(gallery, model)  # its one-line error when it has none
        return Serving(gallery, model, grant.gallery_version, grant.relation, "grant")
    newest = records[-1]
    if newest.gallery_version is None:
        raise RevokedError(
            f"model {model!r} may not query gallery {gallery!r}: revoked at {newest.created} by "
            f"{newest.writer} ({_dir_uri(store, gallery, model)}/{newest.seq:08d}.json); "
            f"`raycompat rollback` or `promote` serves it again"
        )
    grant = catalog.grant_of(gallery, model)
    same = grant is not None and grant.gallery_version == newest.gallery_version
    relation = grant.relation if same else "extracted"
    return Serving(gallery, model, newest.gallery_version, relation, f"alias {newest.seq}")


def _dir_uri(store: GalleryStore, gallery: str, model: str) -> str:
    return store.backend.uri(_dir(store, gallery, model))


def _append(
    store: GalleryStore,
    records: list[AliasRecord],
    change: tuple[str, str, str, str | None, int | None],
    lease: LeaseRef | None,
) -> AliasRecord:
    """Write ``change`` (gallery, model, action, version, back) as the log's next record,
    create-if-absent; see :class:`AliasConflictError`."""
    gallery, model, action, version, back = change
    seq = len(records) + 1
    served = records[-1].gallery_version if records else granted_version(store, gallery, model)
    stamp = checked_stamp(store, lease, f"{action} {model} on {gallery}")
    owner = LeaseOwner()
    writer, at, by = owner.describe(), now_utc(), asdict(owner)
    record = AliasRecord(*change[:2], seq, action, version, served, back, writer, stamp, at, by)
    path = join(_dir(store, gallery, model), f"{seq:08d}.json")
    write_numbered(store, path, record, lambda: _lost(store, path, change, seq))
    return record


def _lost(store: GalleryStore, path: str, change: tuple, seq: int) -> AliasConflictError:
    """The error of a ``change`` whose number ``seq`` another writer took first."""
    gallery, model, action = change[:3]
    won = log(store, gallery, model)[seq - 1]
    return AliasConflictError(
        f"{store.backend.uri(path)}: {won.writer} recorded change {seq} of {model!r} on "
        f"{gallery!r} first ({won.action} {won.gallery_version}); this {action} is "
        f"not recorded: check `raycompat history {gallery}` and retry"
    )


def granted_version(store: GalleryStore, gallery: str, model: str) -> str | None:
    """The version the model's grant names, or None without a grant (a corrupt one raises)."""
    grant = Catalog(store).grant_of(gallery, model)
    return grant.gallery_version if grant else None


def promote(
    store: GalleryStore, gallery: str, model: str, version: str, lease: LeaseRef | None = None
) -> AliasRecord | None:
    """``model`` serves ``version`` of ``gallery`` from now on; None (nothing written) when it
    already does.

    Raises:
        NotInStoreError: ``model`` is not registered (lists those that are).
        RetiredModelError: the model was retired.
        NotServableError: ``version`` is not one the model may serve (names those it may).
        AliasConflictError: another writer changed the model's alias first.
    """
    catalog = Catalog(store)
    model_record(catalog, model)  # an unregistered name lists the registered ones (exit 2)
    refuse_retired(store, model, f"promote it to {gallery} {version}")
    allowed = servable(store, gallery, model)
    if version not in allowed:
        raise NotServableError(
            f"model {model} may not serve {gallery} {version}: it may serve "
            f"{', '.join(allowed) or 'nothing (no grant, and no version of its own)'} (its "
            f"grant's version, or a published version whose model is {model})"
        )
    records = log(store, gallery, model)
    if records and records[-1].gallery_version == version:
        return None
    if not records and granted_version(store, gallery, model) == version:
        return None
    change = (gallery, model, "promote", version, len(records))
    return _append(store, records, change, lease)


def revoke(
    store: GalleryStore, gallery: str, model: str, lease: LeaseRef | None = None
) -> AliasRecord | None:
    """``model`` serves nothing on ``gallery`` from now on; None when it is already revoked.

    Raises:
        StoreError: the model serves nothing there (no grant, no alias).
    """
    records = log(store, gallery, model)
    if records and records[-1].gallery_version is None:
        return None
    if not records and granted_version(store, gallery, model) is None:
        raise StoreError(
            f"model {model!r} serves nothing on gallery {gallery!r} (no grant, no alias): "
            "nothing to revoke"
        )
    change = (gallery, model, "revoke", None, len(records))
    return _append(store, records, change, lease)


def rollback(
    store: GalleryStore, gallery: str, model: str, lease: LeaseRef | None = None
) -> AliasRecord:
    """Undo the newest standing promote or revoke: serve what was served before it.

    Raises:
        NoRollbackError: nothing earlier to return to (names what it serves now).
        RetiredModelError: the model was retired.
        ManifestError: the earlier version is no longer published (gc removed it).
    """
    refuse_retired(store, model, f"roll it back on {gallery}")
    records = log(store, gallery, model)
    back = records[-1].back if records else None
    if back is None or (back == 0 and granted_version(store, gallery, model) is None):
        now = records[-1].gallery_version if records else granted_version(store, gallery, model)
        raise NoRollbackError(
            f"model {model} on gallery {gallery} has nothing to roll back to: it serves "
            f"{now or 'nothing'} and no earlier alias stands ({_dir_uri(store, gallery, model)})"
        )
    target = records[back - 1] if back else None
    version = target.gallery_version if target else granted_version(store, gallery, model)
    if version is not None:
        store.version(gallery, version)  # still published: its one-line error if not
    change = (gallery, model, "rollback", version, target.back if target else None)
    return _append(store, records, change, lease)
