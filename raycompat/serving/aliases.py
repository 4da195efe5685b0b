"""Named aliases: ``prod``, ``staging``: a gallery version and the query model that searches it.

A service searches ``prod``; an operator swaps what ``prod`` points at among the compatible
pairs (``compatible_pairs.py``: the compatibility check is the gate), and rolls it back. Each
alias is an append-only log of immutable records, as a model's served-version log is
(``served_log.py``)::

    <root>/<gallery>/_named/<alias>/00000001.json    a NamedAliasRecord per change

Each record is created with the store's create-if-absent primitive, numbered one past the
newest: of two writers racing for the same number exactly one wins, the other gets
:class:`NamedAliasConflictError` and nothing of its change is written. A record is never
rewritten. ``by`` records the writer (``LeaseOwner``: job, host, pid); a writer holding a lease
passes its ``LeaseRef``, checked just before the write and recorded.

- ``set_alias(g, a, v, m)``: ``a`` points at ``(v, m)`` from now on; an incompatible pair is
  :class:`IncompatiblePairError` (exit 2) and nothing is written; the same pair again is a no-op.
- ``rollback(g, a)``: ``a`` points again at the pair it pointed at before its newest standing
  change (``back`` links each record to the state it replaced).
- ``resolve(g, a)``: what ``a`` points at (its newest record), refused once its model was
  retired or revoked on the gallery (``refuse_stopped``): those stop a model everywhere.
- ``reachable(records)``: the pair it points at and every version rollbacks would return to:
  gc keeps them all (``serving_map.serving_map``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from raycompat.errors import NotInStoreError, StoreError, UsageError
from raycompat.serving.compatible_pairs import Compatibility, compatibility, refusal
from raycompat.serving.served_log import (
    AliasConflictError,
    NoRollbackError,
    RevokedError,
    checked_stamp,
    numbered_files,
    numbered_log,
    write_numbered,
)
from raycompat.serving.served_log import log as model_log
from raycompat.store.catalog.decisions import Decisions
from raycompat.store.catalog.models import Catalog
from raycompat.store.catalog.retired import refuse_retired
from raycompat.store.commit.lease import LeaseOwner, LeaseRef
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import now_utc
from raycompat.store.paths import check_name, join
from raycompat.store.read.lookup import model_record, unknown_name, version_record
from raycompat.store.records import check_choice, check_record, load_object

NAMED_DIR = "_named"
ACTIONS = ("set", "rollback")


class NamedAliasConflictError(AliasConflictError):
    """Another writer recorded the same change number of the alias first; this one is not
    written."""


class IncompatiblePairError(UsageError, StoreError):
    """The model may not search the version (no compatibility criterion allows it): a usage
    error, exit 2, as promoting a version a model may not serve is."""


@dataclass
class NamedAliasRecord:
    """Change ``seq`` of ``alias`` on ``gallery``: from here on it points at
    ``(gallery_version, model_version)`` (``relation`` and ``why``: the gate's answer) instead
    of ``previous``; a rollback returns to the state of record ``back`` (None: nothing
    earlier). ``by``: who wrote it (``LeaseOwner`` as a dict)."""

    gallery: str
    alias: str
    seq: int
    action: str
    gallery_version: str
    model_version: str
    relation: str
    why: str
    previous: dict | None
    back: int | None
    by: dict
    lease: dict = field(default_factory=dict)
    created: str = ""

    @classmethod
    def from_json(cls, data: bytes, source: str) -> NamedAliasRecord:
        raw = load_object(data, source, "named alias record")
        check_record(raw, cls, source, "named alias record")
        check_choice(raw, "action", ACTIONS, source, "named alias record")
        return cls(**raw)

    @property
    def pair(self) -> dict:
        return {"gallery_version": self.gallery_version, "model_version": self.model_version}

    def writer(self) -> str:
        return ", ".join(f"{key} {value}" for key, value in self.by.items())


def _dir(store: GalleryStore, gallery: str, alias: str) -> str:
    return store.path(check_name("gallery", gallery), NAMED_DIR, check_name("alias", alias))


def names(store: GalleryStore, gallery: str) -> list[str]:
    """The gallery's named aliases, sorted."""
    selector = pafs.FileSelector(store.path(gallery, NAMED_DIR), allow_not_found=True)
    entries = store.filesystem.get_file_info(selector)
    return sorted(e.base_name for e in entries if e.type == pafs.FileType.Directory)


def changes(store: GalleryStore, gallery: str, alias: str) -> int:
    """How many changes the alias's log holds: one listing, no record read (as
    ``served_log.changes`` for a model's log; the search service's check before each request)."""
    return len(numbered_files(store, _dir(store, gallery, alias)))


def log(store: GalleryStore, gallery: str, alias: str) -> list[NamedAliasRecord]:
    """The alias's records, oldest first ([] for a new alias); a corrupt or missing one raises
    ``CorruptFileError`` naming it (a gap would break the rollback links)."""
    return numbered_log(
        store, _dir(store, gallery, alias), NamedAliasRecord.from_json,
        lambda record: (record.gallery, record.alias), (gallery, alias), "named alias record",
    )  # fmt: skip


def refuse_stopped(store: GalleryStore, gallery: str, model: str, what: str) -> None:
    """Raise ``RetiredModelError`` if ``model`` was retired, :class:`RevokedError` if it was
    revoked on ``gallery`` (its newest model alias serves nothing): an alias cannot serve it."""
    refuse_retired(store, model, what)
    records = model_log(store, gallery, model)
    if records and records[-1].gallery_version is None:
        raise RevokedError(
            f"model {model} was revoked on gallery {gallery} at {records[-1].created} by "
            f"{records[-1].writer}; refusing to {what} (`raycompat rollback {gallery} --model "
            f"{model}` undoes the revoke)"
        )


def _unknown(store: GalleryStore, gallery: str, alias: str) -> NotInStoreError:
    what = f"gallery {gallery!r} has no alias {alias!r}"
    return unknown_name(what, alias, names(store, gallery), "its aliases")


def resolve(store: GalleryStore, gallery: str, alias: str) -> NamedAliasRecord:
    """The record ``alias`` points by (its newest).

    Raises:
        NotInStoreError: the gallery has no such alias (lists those it has).
        RetiredModelError, RevokedError: the pair's model was retired, or revoked on the
            gallery, since.
    """
    records = log(store, gallery, alias)
    if not records:
        raise _unknown(store, gallery, alias)
    newest = records[-1]
    refuse_stopped(store, gallery, newest.model_version, f"search {gallery} through alias {alias}")
    return newest


def reachable(records: list[NamedAliasRecord]) -> tuple[dict | None, list[dict]]:
    """``(pair now, pairs successive rollbacks return to)`` of an alias's records."""
    if not records:
        return None, []
    chain, back = [], records[-1].back
    while back is not None:
        chain.append(records[back - 1].pair)
        back = records[back - 1].back
    return records[-1].pair, chain


def gate(store: GalleryStore, gallery: str, alias: str, version: str, model: str) -> Compatibility:
    """The gate's answer (``compatible_pairs.Compatibility``) for pointing ``alias`` at
    ``(version, model)``.

    Raises:
        NotInStoreError: no such gallery or version, or an unregistered model never judged.
        RetiredModelError, RevokedError: the model was retired, or revoked on the gallery.
        IncompatiblePairError: the model may not search the version (says why).
    """
    check_name("alias", alias)
    info = version_record(store, gallery, version)
    check_name("model", model)
    refuse_stopped(store, gallery, model, f"point alias {alias} at it")
    catalog = Catalog(store)
    try:
        model_record(catalog, model)
        registered = True
    except NotInStoreError:
        if not Decisions(store).attempts(gallery, model):
            raise  # never judged either: the error lists the registered models
        registered = False  # judged and refused: the refusal says more than the name
    allowed = compatibility(store, gallery, info, model)
    if allowed is None:
        why = refusal(store, gallery, info, model)
        raise IncompatiblePairError(
            f"alias {alias} may not point at ({version}, {model}) on {gallery}: {why}"
        )
    if not registered:
        model_record(catalog, model)
    return allowed


def _append(
    store: GalleryStore,
    records: list[NamedAliasRecord],
    change: tuple[str, str, str, str, str, Compatibility, int | None],
    lease: LeaseRef | None,
) -> NamedAliasRecord:
    """Write ``change`` (gallery, alias, action, version, model, gate answer, back) as the log's
    next record, create-if-absent; see :class:`NamedAliasConflictError`."""
    gallery, alias, action, version, model, allowed, back = change
    seq = len(records) + 1
    stamp = checked_stamp(store, lease, f"{action} alias {alias} on {gallery}")
    previous = records[-1].pair if records else None
    record = NamedAliasRecord(
        gallery, alias, seq, action, version, model, allowed.relation, allowed.why, previous,
        back, asdict(LeaseOwner()), stamp, now_utc(),
    )  # fmt: skip
    path = join(_dir(store, gallery, alias), f"{seq:08d}.json")
    write_numbered(store, path, record, lambda: _lost(store, path, change, seq))
    return record


def _lost(store: GalleryStore, path: str, change: tuple, seq: int) -> NamedAliasConflictError:
    """The error of a ``change`` whose number ``seq`` another writer took first."""
    gallery, alias, action = change[:3]
    won = log(store, gallery, alias)[seq - 1]
    return NamedAliasConflictError(
        f"{store.backend.uri(path)}: {won.writer()} recorded change {seq} of alias {alias!r} "
        f"on {gallery!r} first ({won.action} ({won.gallery_version}, {won.model_version})); "
        f"this {action} is not recorded: check `raycompat alias list {gallery}` and retry"
    )


def set_alias(
    store: GalleryStore,
    gallery: str,
    alias: str,
    version: str,
    model: str,
    lease: LeaseRef | None = None,
) -> NamedAliasRecord | None:
    """``alias`` points at ``(version, model)`` from now on; None (nothing written) when it
    already does. Raises what :func:`gate` raises, and :class:`NamedAliasConflictError`."""
    allowed = gate(store, gallery, alias, version, model)
    records = log(store, gallery, alias)
    if records and (records[-1].gallery_version, records[-1].model_version) == (version, model):
        return None
    back = len(records) or None
    return _append(store, records, (gallery, alias, "set", version, model, allowed, back), lease)


def rollback(
    store: GalleryStore, gallery: str, alias: str, lease: LeaseRef | None = None
) -> NamedAliasRecord:
    """Undo the alias's newest standing change: point again at the pair before it, through
    the gate again (a model retired since is refused).

    Raises:
        NotInStoreError: no such alias.
        NoRollbackError: nothing earlier to return to.
        NamedAliasConflictError: another writer changed the alias first.
    """
    records = log(store, gallery, alias)
    if not records:
        raise _unknown(store, gallery, alias)
    newest = records[-1]
    if newest.back is None:
        raise NoRollbackError(
            f"alias {alias} on gallery {gallery} has nothing to roll back to: it points at "
            f"({newest.gallery_version}, {newest.model_version}) and no earlier change stands "
            f"({store.backend.uri(_dir(store, gallery, alias))})"
        )
    target = records[newest.back - 1]
    version, model = target.gallery_version, target.model_version
    allowed = gate(store, gallery, alias, version, model)
    change = (gallery, alias, "rollback", version, model, allowed, target.back)
    return _append(store, records, change, lease)
