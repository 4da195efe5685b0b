"""Retired models: a tombstone per model that stops it serving every gallery, for good.

    <root>/_retired/<model_version>.json    a RetiredRecord (model, reason, writer, created)

Written once with the store's create-if-absent primitive and never rewritten or removed:
retiring a model twice returns the first record. The model's own record (``_models/``) and its
grants stay as they were (records are immutable); what reads them honours the tombstone instead:
the serving layer's ``served_log.current`` (``raycompat search``) refuses a retired model naming
when it was retired, ``served_log.promote`` and ``Catalog.grant`` refuse new aliases and grants
for it, and the serving map gc is handed (``serving_map.serving_map``) no longer counts the
versions it served. The folder is ``_``-prefixed, so no gallery listing reads it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import pyarrow.fs as pafs

from raycompat.errors import CorruptFileError, StoreError
from raycompat.store.commit.lease import LeaseOwner
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import now_utc
from raycompat.store.paths import check_name, join
from raycompat.store.records import check_record, load_object

RETIRED_DIR = "_retired"


class RetiredModelError(StoreError):
    """The model was retired: it serves no gallery and takes no new grant or alias."""


@dataclass
class RetiredRecord:
    """``model_version`` was retired at ``created`` by ``writer`` (job, host, pid)."""

    model_version: str
    writer: str
    reason: str = ""
    created: str = ""

    @classmethod
    def from_json(cls, data: bytes, source: str) -> RetiredRecord:
        raw = load_object(data, source, "retired record")
        check_record(raw, cls, source, "retired record")
        return cls(**raw)

    def line(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"model {self.model_version} was retired at {self.created} by {self.writer}{why}"


def _path(store: GalleryStore, model_version: str) -> str:
    return join(store.backend.root, RETIRED_DIR, f"{check_name('model', model_version)}.json")


def retired(store: GalleryStore, model_version: str) -> RetiredRecord | None:
    """The model's tombstone, or None while it is live; a corrupt one raises, naming it."""
    path = _path(store, model_version)
    backend = store.backend
    if backend.filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    source = backend.uri(path)
    with backend.filesystem.open_input_stream(path) as stream:
        record = RetiredRecord.from_json(stream.read(), source)
    if record.model_version != model_version:
        raise CorruptFileError(
            f"{source}: retired record is for model {record.model_version!r}, but its path "
            f"names {model_version!r}"
        )
    return record


def refuse_retired(store: GalleryStore, model_version: str, what: str) -> None:
    """Raise :class:`RetiredModelError` ("model m2 was retired at <time> ...; refusing to
    <what>") if the model was retired."""
    record = retired(store, model_version)
    if record is not None:
        raise RetiredModelError(f"{record.line()}; refusing to {what}")


def retire(store: GalleryStore, model_version: str, reason: str = "") -> RetiredRecord:
    """Retire the model everywhere (create-if-absent); returns the (first) tombstone."""
    record = RetiredRecord(model_version, LeaseOwner().describe(), reason, now_utc())
    path = _path(store, model_version)
    store.mark()  # gc manages only marked stores (marker.py)
    try:
        store.backend.create_exclusive(path, json.dumps(asdict(record), indent=2).encode())
    except FileExistsError:
        return retired(store, model_version)
    return record
