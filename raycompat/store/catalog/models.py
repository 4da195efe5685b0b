"""The model catalog: which model versions exist and which gallery version each may query.

Kept beside the galleries it describes, as immutable JSON records written with the store's
create-if-absent primitive (the same one that publishes versions, see ``manifest.py``)::

    <root>/_models/<model_version>.json              a ModelRecord (its ``uri``:
                                                     ``_models/<model_version>``, relative to
                                                     the root: ``relative.py``)
    <root>/_models/<model_version>/                  its files (model.safetensors + model.json,
                                                     and an FCT transformation's h.*), copied in
                                                     before the record is written; none for a
                                                     model without weights (``uri`` "": adopted,
                                                     or a transform job's target)
    <root>/<gallery>/_queries/<model_version>.json   a QueryGrant: the gallery version the model
                                                     queries, and why that is allowed

A record is never rewritten, so an upgrade that is run twice cannot register a model twice or
point it at two gallery versions: registering the same content again is a no-op, different
content is a :class:`CatalogConflictError`. Grants name how the gallery version relates to the
model: ``extracted`` (computed by this model), ``compatible`` (the model passed the empirical
compatibility criterion against the version's model: no rewrite, CoReS/BCT/HOC), or
``transformed`` (the version was moved forward to this model by an FCT transformation).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from raycompat.errors import CorruptFileError, SchemaError, StoreError
from raycompat.store.catalog.retired import refuse_retired
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import now_utc
from raycompat.store.paths import check_name, check_relative_path, join
from raycompat.store.records import check_choice, check_record, load_object
from raycompat.store.relative import is_absolute, resolve, to_record

MODELS_DIR, QUERIES_DIR = "_models", "_queries"
RELATIONS = ("extracted", "compatible", "transformed", "adapted")  # adapted: query_adapters.py


class CatalogConflictError(StoreError):
    """A record already exists with different content (a second upgrade under the same name)."""


class NoWeightsError(StoreError):
    """The model is registered without weights (``raycompat adopt``, a transform job's target):
    it queries with stored or given vectors, but cannot embed images or be trained against."""


@dataclass
class ModelRecord:
    """A registered model version.

    Attributes:
        model_version: safe name (``"m3"``).
        uri: directory of the exported model (``model.safetensors`` + ``model.json``):
            relative to the store root when the store holds it (``_models/m3``, so a copied
            store loads its own files), else absolute; :meth:`Catalog.model_uri` resolves it.
        embed_dim: the width of its embeddings.
        method: how it was trained (a registered compatibility method).
        parent: the model version it was trained to be compatible with, if any.
    """

    model_version: str
    uri: str
    embed_dim: int
    method: str = ""
    parent: str | None = None
    run: str = ""
    created: str = ""

    @property
    def has_weights(self) -> bool:
        """False for a model registered without files (an empty ``uri``): one trained outside
        raycompat whose vectors were adopted or written by a transform job."""
        return bool(self.uri)

    @classmethod
    def from_json(cls, data: bytes, source: str) -> ModelRecord:
        """Parse and schema-check a record; every error names ``source`` and the key."""
        raw = load_object(data, source, "model record")
        check_record(raw, cls, source, "model record")
        for key in ("model_version", "parent"):
            if raw.get(key) is not None:
                _check_name(source, "model record", key, "model", raw[key])
        if raw["uri"] and not is_absolute(raw["uri"]):
            try:  # a store-relative path: it must stay under the root
                check_relative_path(raw["uri"], f"{source}: model record key 'uri'")
            except StoreError as error:
                raise CorruptFileError(str(error)) from None
        if raw["embed_dim"] < 1:
            raise CorruptFileError(
                f"{source}: model record key 'embed_dim' must be >= 1, got {raw['embed_dim']}"
            )
        return cls(**raw)


@dataclass
class QueryGrant:
    """``model_version`` queries ``gallery`` at ``gallery_version`` (``relation`` says why)."""

    gallery: str
    gallery_version: str
    model_version: str
    relation: str
    evidence: dict = field(default_factory=dict)  # e.g. cross-test, self-test, ECC
    created: str = ""

    @classmethod
    def from_json(cls, data: bytes, source: str) -> QueryGrant:
        """Parse and schema-check a grant; every error names ``source`` and the key."""
        raw = load_object(data, source, "query grant")
        check_record(raw, cls, source, "query grant")
        for key, kind in (
            ("gallery", "gallery"),
            ("gallery_version", "version"),
            ("model_version", "model"),
        ):
            _check_name(source, "query grant", key, kind, raw[key])
        check_choice(raw, "relation", RELATIONS, source, "query grant")
        return cls(**raw)


def _check_name(source: str, what: str, key: str, kind: str, value: str) -> None:
    try:
        check_name(kind, value)
    except StoreError as error:
        raise CorruptFileError(f"{source}: {what} key {key!r}: {error}") from None


def differences(stored, new) -> list[str]:
    """``"key <stored>, now <new>"`` for each key two records disagree on (``created`` aside)."""
    a, b = asdict(stored), asdict(new)
    return [f"{k} {a[k]!r}, now {b[k]!r}" for k in a if k != "created" and a[k] != b[k]]


class Catalog:
    def __init__(self, store: GalleryStore) -> None:
        self.store = store
        self._backend = store.backend

    def _read(self, path: str, cls):
        """The record at ``path``, schema-checked, and checked to be the one its path names
        (``_models/<model_version>.json``, ``<gallery>/_queries/<model_version>.json``)."""
        source = self._backend.uri(path)
        with self._backend.filesystem.open_input_stream(path) as stream:
            record = cls.from_json(stream.read(), source)
        if cls is ModelRecord:  # an absolute uri of an earlier release, under this root
            record.uri = to_record(self._backend, record.uri)
        parts = path.rsplit("/", 3)
        expected = {"model_version": parts[-1][: -len(".json")]}
        if cls is QueryGrant:
            expected["gallery"] = parts[-3]
        for key, value in expected.items():
            if getattr(record, key) != value:
                raise CorruptFileError(
                    f"{source}: record key {key!r} is {getattr(record, key)!r}, but its path "
                    f"names {value!r}"
                )
        return record

    def _exists(self, path: str) -> bool:
        return self._backend.filesystem.get_file_info(path).type != pafs.FileType.NotFound

    def _create(self, path: str, record, what: str):
        """Write ``record`` once; the same content again returns the stored record."""
        record.created = record.created or now_utc()
        self.store.mark()  # gc manages only marked stores (marker.py)
        try:
            self._backend.create_exclusive(path, json.dumps(asdict(record), indent=2).encode())
            return record
        except FileExistsError:
            existing = self._read(path, type(record))
            differ = differences(existing, record)
            if not differ:
                return existing
            raise CatalogConflictError(
                f"{what} is already recorded at {self._backend.uri(path)} with different "
                f"content ({'; '.join(differ)}); records are immutable: use a new name"
            ) from None

    def _model_path(self, model_version: str) -> str:
        return join(self._backend.root, MODELS_DIR, f"{check_name('model', model_version)}.json")

    def model_files_uri(self, model_version: str) -> str:
        return self._backend.uri(self._files_path(model_version))

    def model_uri(self, model_version: str) -> str:
        """Where the registered model's files are: its record's ``uri`` resolved against this
        store's root (a store-relative path), or the absolute path it records."""
        source = self._backend.uri(self._model_path(model_version))
        return resolve(self._backend, self.model(model_version).uri, source)

    def _files_path(self, model_version: str) -> str:
        return join(self._backend.root, MODELS_DIR, check_name("model", model_version))

    def put_model_files(
        self, model_version: str, local_dir: str, names: list[str] | None = None
    ) -> str:
        """Copy the files ``names`` of ``local_dir`` (default: every file in it) into the store
        beside the record; returns their URI.

        Done before :meth:`register_model`, so a record never points at missing files. Copying
        the same files again (a rerun) overwrites them with identical bytes; a registered
        model's files are never replaced.
        """
        if self._exists(self._model_path(model_version)):
            return self.model_files_uri(model_version)
        target = self._files_path(model_version)
        fs = self._backend.filesystem
        self.store.mark()
        fs.create_dir(target, recursive=True)
        for name in sorted(os.listdir(local_dir)) if names is None else names:
            source = os.path.join(local_dir, name)
            if os.path.isfile(source):
                with open(source, "rb") as handle, fs.open_output_stream(join(target, name)) as out:
                    out.write(handle.read())
        return self.model_files_uri(model_version)

    def fetch_model_files(
        self, model_version: str, local_dir: str, purpose: str = "load its weights"
    ) -> str:
        """Copy a registered model's stored files into ``local_dir``; returns ``local_dir``.

        Raises:
            StoreError: not registered, or its files are missing.
            NoWeightsError: it was registered without weights (:attr:`ModelRecord.has_weights`);
                the message says it cannot ``purpose``.
        """
        self.weights_of(model_version, purpose)
        fs = self._backend.filesystem
        selector = pafs.FileSelector(self._files_path(model_version), allow_not_found=True)
        infos = [i for i in fs.get_file_info(selector) if i.type == pafs.FileType.File]
        if not infos:
            raise StoreError(
                f"model {model_version!r} is registered but has no files at "
                f"{self.model_files_uri(model_version)}"
            )
        os.makedirs(local_dir, exist_ok=True)
        for info in infos:
            with fs.open_input_stream(info.path) as stream:
                data = stream.read()
            with open(os.path.join(local_dir, info.base_name), "wb") as out:
                out.write(data)
        return local_dir

    def weights_of(self, model_version: str, purpose: str) -> ModelRecord:
        """The record of a model that has weights, else a one-line :class:`NoWeightsError`
        saying that it cannot ``purpose`` (e.g. "embed query images")."""
        record = self.model(model_version)  # StoreError when not registered
        if not record.has_weights:
            raise NoWeightsError(
                f"model {model_version!r} has no weights in {self.store.uri()} (registered "
                f"without files, method {record.method!r}): it cannot {purpose}; it queries "
                "with vectors (search --vectors or --ids)"
            )
        return record

    def registered_or(self, record: ModelRecord, what: str) -> ModelRecord:
        """The registered record of ``record.model_version`` when there is one (its width must
        be ``record.embed_dim``: else a SchemaError saying ``what`` holds), else ``record``."""
        try:
            existing = self.model(record.model_version)
        except CorruptFileError:
            raise
        except StoreError:
            return record
        if existing.embed_dim != record.embed_dim:
            raise SchemaError(
                f"model {record.model_version!r} embeds to {existing.embed_dim}-d but {what} "
                f"holds {record.embed_dim}-d rows"
            )
        return existing

    def without_weights(self) -> list[str]:
        """The readable registered models that have no weights (corrupt records skipped)."""
        return [m.model_version for m in self.models_report()[0] if not m.has_weights]

    def register_model(self, record: ModelRecord) -> ModelRecord:
        if record.parent is not None:
            try:
                self.model(record.parent)
            except StoreError as err:
                raise StoreError(f"model {record.model_version!r}: its parent {err}") from None
        record.uri = to_record(self._backend, record.uri)  # inside the store: relative
        return self._create(
            self._model_path(record.model_version), record, f"model {record.model_version!r}"
        )

    def model(self, model_version: str) -> ModelRecord:
        path = self._model_path(model_version)
        if not self._exists(path):
            raise StoreError(
                f"model {model_version!r} is not registered ({self._backend.uri(path)})"
            )
        return self._read(path, ModelRecord)

    def _list(self, directory: str, cls, corrupt: list | None = None) -> list:
        """Records under ``directory``, oldest first. With a ``corrupt`` list, an unreadable
        record is appended to it as ``(uri, error)`` instead of raising."""
        selector = pafs.FileSelector(directory, allow_not_found=True)
        infos = self._backend.filesystem.get_file_info(selector)
        records = []
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.endswith(".json"):
                continue
            try:
                records.append(self._read(info.path, cls))
            except StoreError as error:
                if corrupt is None:
                    raise
                corrupt.append((self._backend.uri(info.path), str(error)))
        return sorted(records, key=lambda r: r.created)

    def models(self) -> list[ModelRecord]:
        """Registered models, oldest first; a corrupt record raises ``CorruptFileError``."""
        return self._list(join(self._backend.root, MODELS_DIR), ModelRecord)

    def models_report(self) -> tuple[list[ModelRecord], list[tuple[str, str]]]:
        """The readable model records and ``(uri, error)`` for each corrupt one."""
        corrupt: list[tuple[str, str]] = []
        return self._list(join(self._backend.root, MODELS_DIR), ModelRecord, corrupt), corrupt

    def _grant_path(self, gallery: str, model_version: str) -> str:
        return join(
            self._backend.root,
            check_name("gallery", gallery),
            QUERIES_DIR,
            f"{check_name('model', model_version)}.json",
        )

    def grant(self, grant: QueryGrant) -> QueryGrant:
        """Record that ``grant.model_version`` queries the (published) gallery version; a
        retired model (``retired.py``) gets no new grant (``RetiredModelError``)."""
        if grant.relation not in RELATIONS:
            raise ValueError(f"relation {grant.relation!r} is not one of {', '.join(RELATIONS)}")
        model = self.model(grant.model_version)
        info = self.store.version(grant.gallery, grant.gallery_version)
        # a compatible model compares shared coordinates; an adapted one maps its queries
        if grant.relation not in ("compatible", "adapted") and info.width != model.embed_dim:
            raise StoreError(
                f"gallery {grant.gallery} {grant.gallery_version} holds {info.width}-d rows but "
                f"model {model.model_version} embeds to {model.embed_dim}-d"
            )
        path = self._grant_path(grant.gallery, grant.model_version)
        if not self._exists(path):  # a rerun's same grant stays a no-op
            refuse_retired(self.store, grant.model_version, f"grant it {grant.gallery!r}")
        return self._create(
            path, grant, f"the query grant of {grant.model_version!r} on {grant.gallery!r}"
        )

    def queryable_version(self, gallery: str, model_version: str) -> QueryGrant:
        """The gallery version ``model_version`` may query, or a StoreError saying it has none."""
        path = self._grant_path(gallery, model_version)
        if not self._exists(path):
            raise StoreError(
                f"model {model_version!r} may not query gallery {gallery!r}: no grant at "
                f"{self._backend.uri(path)} (it was refused, or its upgrade has not run)"
            )
        return self._read(path, QueryGrant)

    def grant_of(self, gallery: str, model_version: str) -> QueryGrant | None:
        """The model's grant on the gallery, or None without one (a corrupt one raises
        ``CorruptFileError``)."""
        path = self._grant_path(gallery, model_version)
        return self._read(path, QueryGrant) if self._exists(path) else None

    def grants(self, gallery: str) -> list[QueryGrant]:
        """The gallery's query grants, oldest first; a corrupt one raises ``CorruptFileError``."""
        return self._list(self._grants_dir(gallery), QueryGrant)

    def grants_report(self, gallery: str) -> tuple[list[QueryGrant], list[tuple[str, str]]]:
        """The gallery's readable grants and ``(uri, error)`` for each corrupt one."""
        corrupt: list[tuple[str, str]] = []
        return self._list(self._grants_dir(gallery), QueryGrant, corrupt), corrupt

    def _grants_dir(self, gallery: str) -> str:
        return join(self._backend.root, check_name("gallery", gallery), QUERIES_DIR)
