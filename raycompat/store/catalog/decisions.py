"""Upgrade decisions, kept in the store: every judgement of an entry, never overwritten.

Without a record a rerun of the same history would train and judge a refused upgrade again, and
reach the same answer. Each time an entry is trained and judged (its first run, a run whose
config changed, or ``--retry``) the outcome is recorded as a new *attempt*::

    <root>/<gallery>/_decisions/<model_version>/00000001.json    a DecisionRecord per attempt

with the digest of the configuration it was judged under (the entry, the shared training
config, the policy and the gallery model it was compared with). Attempts are created with the
store's create-if-absent primitive, as version records are: a recorded decision is never
replaced or deleted, by a later run, a failed one or a concurrent one. Of two runs racing for the
same attempt number exactly one writes it; the other gets :class:`DecisionConflictError`.

What a rerun acts on is the *standing* decision (:func:`standing`): the newest attempt, except
that a failure never stands over a refusal or a publication judged under the same config (a
``--retry`` that crashes leaves the refusal standing). :meth:`Decisions.get` gives the standing
refusal or failure, or None when there is none: never judged, the standing attempt published,
or the model holds a query grant on the gallery (the grant is the record of a success).
A store written before attempts were numbered holds ``_decisions/<model_version>.json``; it is
read as attempt 0.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from raycompat.errors import CorruptFileError, StoreError
from raycompat.store.catalog.models import QUERIES_DIR
from raycompat.store.commit.lease import LeaseOwner
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import now_utc
from raycompat.store.paths import check_name, join
from raycompat.store.records import check_choice, check_record, load_object

DECISIONS_DIR = "_decisions"
OUTCOMES = ("refused", "failed", "published")
NOT_PUBLISHED = ("refused", "failed")


class DecisionConflictError(StoreError):
    """Another run recorded this attempt first; the earlier record stands."""


@dataclass
class DecisionRecord:
    """``model_version`` was judged for ``gallery``.

    ``outcome``: ``refused`` (the evidence said no), ``failed`` (the upgrade raised) or
    ``published``; ``reason``: the decision or the error, one line; ``digest``: of the config it
    ran under; ``attempt``: its number among the entry's attempts (set when recorded); ``by``:
    who recorded it, ``asdict(LeaseOwner)`` (set when recorded; None in older records).
    """

    gallery: str
    model_version: str
    outcome: str
    reason: str
    digest: str
    against: str | None = None
    evidence: dict = field(default_factory=dict)
    created: str = ""
    attempt: int = 0
    by: dict | None = None

    @classmethod
    def from_json(cls, data: bytes, source: str) -> DecisionRecord:
        raw = load_object(data, source, "decision record")
        check_record(raw, cls, source, "decision record")
        check_choice(raw, "outcome", OUTCOMES, source, "decision record")
        return cls(**raw)


def standing(attempts: list[DecisionRecord], digest: str | None = None) -> DecisionRecord | None:
    """The decision a rerun acts on, of ``attempts`` (oldest first; only those judged under
    ``digest`` when given): the newest, unless it is a failure and a refusal or publication
    was judged under the same config, which then stands."""
    if digest is not None:
        attempts = [a for a in attempts if a.digest == digest]
    if not attempts:
        return None
    newest = attempts[-1]
    judged = [a for a in attempts if a.digest == newest.digest and a.outcome != "failed"]
    return judged[-1] if newest.outcome == "failed" and judged else newest


class Decisions:
    """Record and read the decision attempts of a store's galleries."""

    def __init__(self, store: GalleryStore) -> None:
        self._backend = store.backend

    def _dir(self, gallery: str, model_version: str) -> str:
        return join(
            self._backend.root,
            check_name("gallery", gallery),
            DECISIONS_DIR,
            check_name("model", model_version),
        )

    def _read(self, path: str, gallery: str, model_version: str, attempt: int) -> DecisionRecord:
        source = self._backend.uri(path)
        with self._backend.filesystem.open_input_stream(path) as stream:
            record = DecisionRecord.from_json(stream.read(), source)
        if (record.gallery, record.model_version, record.attempt) != (
            gallery,
            model_version,
            attempt,
        ):
            raise CorruptFileError(
                f"{source}: the record is attempt {record.attempt} for {record.model_version!r} "
                f"on {record.gallery!r}, but its path names another; delete it to judge the "
                "upgrade again"
            )
        return record

    def attempts(self, gallery: str, model_version: str) -> list[DecisionRecord]:
        """Every recorded attempt, oldest first. A corrupt one raises ``CorruptFileError``
        naming the file."""
        directory = self._dir(gallery, model_version)
        fs = self._backend.filesystem
        found = [(0, directory + ".json")] if self._exists(directory + ".json") else []
        for entry in fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
            stem = entry.base_name.removesuffix(".json")
            if entry.type == pafs.FileType.File and entry.base_name.endswith(".json"):
                if stem.isdigit() and int(stem) > 0:
                    found.append((int(stem), entry.path))
        return [self._read(p, gallery, model_version, n) for n, p in sorted(found)]

    def _exists(self, path: str) -> bool:
        return self._backend.filesystem.get_file_info(path).type != pafs.FileType.NotFound

    def granted(self, gallery: str, model_version: str) -> bool:
        """Whether the model holds a query grant on the gallery (its upgrade was published)."""
        grant = join(
            self._backend.root,
            check_name("gallery", gallery),
            QUERIES_DIR,
            f"{check_name('model', model_version)}.json",
        )
        return self._exists(grant)

    def get(
        self, gallery: str, model_version: str, digest: str | None = None
    ) -> DecisionRecord | None:
        """The standing refusal or failure (under ``digest`` when given), or None (see the
        module docstring). A corrupt record raises ``CorruptFileError`` naming the file."""
        if self.granted(gallery, model_version):
            return None
        record = standing(self.attempts(gallery, model_version), digest)
        return record if record is not None and record.outcome in NOT_PUBLISHED else None

    def put(self, record: DecisionRecord) -> DecisionRecord:
        """Record ``record`` as the entry's next attempt, create-if-absent.

        Raises:
            DecisionConflictError: another run recorded that attempt first (it stands).
        """
        if record.outcome not in OUTCOMES:
            raise StoreError(f"outcome {record.outcome!r} is not one of {', '.join(OUTCOMES)}")
        earlier = self.attempts(record.gallery, record.model_version)
        record.attempt = earlier[-1].attempt + 1 if earlier else 1
        record.created = now_utc()
        record.by = asdict(LeaseOwner())
        directory = self._dir(record.gallery, record.model_version)
        path = join(directory, f"{record.attempt:08d}.json")
        data = json.dumps(asdict(record), indent=2, default=str).encode()
        try:
            self._backend.create_exclusive(path, data)
        except FileExistsError:
            winner = self._read(path, record.gallery, record.model_version, record.attempt)
            raise DecisionConflictError(
                f"{self._backend.uri(path)}: another run recorded attempt {record.attempt} of "
                f"{record.model_version!r} first ({winner.outcome}: {winner.reason}); it stands, "
                f"and this run's {record.outcome} is not recorded"
            ) from None
        return record
