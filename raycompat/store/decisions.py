"""Upgrades that were judged and not published: refusals and failures, kept in the store.

A refused or failed upgrade publishes nothing, so without a record a rerun of the same history
would train and judge it again, and reach the same answer. Each is recorded per gallery::

    <root>/<gallery>/_decisions/<model_version>.json    a DecisionRecord

with the digest of the configuration it was judged under (the entry, the shared training
config, the policy and the gallery model it was compared with). A rerun whose digest matches
skips the entry and says so; a changed config, or ``--retry``, judges it again and replaces the
record. Unlike versions and grants these records are not immutable (a later judgement
replaces an earlier one), so they are written with the store's atomic replace. A published
upgrade never has one: the grant is the record of a success.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from raycompat.store.errors import CorruptFileError, StoreError
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import now_utc
from raycompat.store.paths import check_name, join
from raycompat.store.records import check_record, load_object

DECISIONS_DIR = "_decisions"
OUTCOMES = ("refused", "failed")


@dataclass
class DecisionRecord:
    """``model_version`` was judged for ``gallery`` and not published.

    ``outcome``: ``refused`` (the evidence said no) or ``failed`` (the upgrade raised);
    ``reason``: the decision or the error, one line; ``digest``: of the config it ran under.
    """

    gallery: str
    model_version: str
    outcome: str
    reason: str
    digest: str
    against: str | None = None
    evidence: dict = field(default_factory=dict)
    created: str = ""

    @classmethod
    def from_json(cls, data: bytes, source: str) -> DecisionRecord:
        raw = load_object(data, source, "decision record")
        check_record(raw, cls, source, "decision record")
        if raw["outcome"] not in OUTCOMES:
            raise CorruptFileError(
                f"{source}: decision record key 'outcome' must be one of {', '.join(OUTCOMES)}, "
                f"got {raw['outcome']!r}"
            )
        return cls(**raw)


class Decisions:
    """Read and replace the decision records of a store's galleries."""

    def __init__(self, store: GalleryStore) -> None:
        self._backend = store.backend

    def _path(self, gallery: str, model_version: str) -> str:
        return join(
            self._backend.root,
            check_name("gallery", gallery),
            DECISIONS_DIR,
            f"{check_name('model', model_version)}.json",
        )

    def get(self, gallery: str, model_version: str) -> DecisionRecord | None:
        """The record, or None. A corrupt one raises ``CorruptFileError`` naming the file (delete
        it to judge the upgrade again)."""
        path = self._path(gallery, model_version)
        fs = self._backend.filesystem
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        source = self._backend.uri(path)
        with fs.open_input_stream(path) as stream:
            record = DecisionRecord.from_json(stream.read(), source)
        if (record.gallery, record.model_version) != (gallery, model_version):
            raise CorruptFileError(
                f"{source}: the record is for {record.model_version!r} on {record.gallery!r}, "
                "but its path names another; delete it to judge the upgrade again"
            )
        return record

    def put(self, record: DecisionRecord) -> DecisionRecord:
        if record.outcome not in OUTCOMES:
            raise StoreError(f"outcome {record.outcome!r} is not one of {', '.join(OUTCOMES)}")
        record.created = now_utc()
        data = json.dumps(asdict(record), indent=2, default=str).encode()
        self._backend.replace(self._path(record.gallery, record.model_version), data)
        return record

    def clear(self, gallery: str, model_version: str) -> None:
        """Forget a decision (the upgrade was published after all)."""
        path = self._path(gallery, model_version)
        try:
            self._backend.filesystem.delete_file(path)
        except FileNotFoundError:
            pass
