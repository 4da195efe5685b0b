"""Adopting an existing Parquet table as a published version, in place: the core steps.

    plan = plan_adoption(store, "faces", "v1", "s3://bucket/tables/faces", model="clip-b32",
                         id_column="image_id", embedding_column="vec")
    reports = [scan_file(store, plan, rel) for rel in plan.files]   # adopt_scan.py, on Ray
    # ids unique across files, unless proven_unique(reports): Ray Data, pipelines/unique.py
    info = publish_adopted(store, plan, summarize(plan, reports))

``raycompat.pipelines.adopt.adopt_version`` runs these with the scans as Ray tasks; this module
imports no Ray. Each scan (``adopt_scan.py``) streams one file and returns a constant-size
:class:`FileReport`: its pin (bytes, ETag or mtime), rows, id fingerprint, min/max id, width,
dtype. Nothing is written until every file has passed; then the record is created
create-if-absent, as for every version, and the model's query grant follows. The files are never
copied or changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow.fs as pafs

from raycompat.store.adopt_scan import FileReport
from raycompat.store.catalog import Catalog, ModelRecord, QueryGrant
from raycompat.store.errors import CorruptFileError, PublishConflictError, SchemaError, StoreError
from raycompat.store.external import ExternalFiles, FilePin
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import VersionInfo, now_utc, record_path
from raycompat.store.part_record import IdFingerprint
from raycompat.store.paths import check_name


@dataclass
class AdoptionPlan:
    """What to adopt: ``files`` (relative to ``root``, a filesystem path; ``uri`` names it)."""

    gallery: str
    version: str
    model: str
    uri: str
    root: str
    files: list[str]
    id_column: str = "id"
    embedding_column: str = "embedding"

    def external(self) -> dict:
        return {"id_column": self.id_column, "embedding_column": self.embedding_column}


def plan_adoption(
    store: GalleryStore,
    gallery: str,
    version: str,
    uri: str,
    *,
    model: str,
    id_column: str = "id",
    embedding_column: str = "embedding",
) -> AdoptionPlan:
    """Check names, the version and the model's grant, and list the ``*.parquet`` files under
    ``uri`` (a folder, an S3 prefix or one file); fails before any file is read."""
    for kind, name in (("gallery", gallery), ("version", version), ("model", model)):
        check_name(kind, name)
    if id_column == embedding_column:
        raise SchemaError(f"the id and embedding columns are both {id_column!r}")
    if (
        store.backend.filesystem.get_file_info(record_path(store.path(gallery), version)).type
        != pafs.FileType.NotFound
    ):
        raise PublishConflictError(f"gallery {gallery!r} already has version {version!r}")
    _check_model(store, gallery, model)
    scheme, _, rest = uri.partition("://") if "://" in uri else ("file", "", uri)
    if scheme != store.backend.scheme:
        raise StoreError(
            f"{uri}: a {store.backend.scheme} store adopts only {store.backend.scheme} tables "
            f"(its readers open the files with the store's filesystem and credentials)"
        )
    root = os.path.abspath(rest) if scheme == "file" else rest.strip("/")
    _check_outside_store(store, root, uri)
    fs = store.backend.filesystem
    found = fs.get_file_info(root)
    if found.type == pafs.FileType.NotFound:
        raise StoreError(f"{uri}: no such folder, prefix or file")
    if found.type == pafs.FileType.File:
        root, files = root.rsplit("/", 1)[0], [root.rsplit("/", 1)[1]]
    else:
        files = sorted(
            e.path[len(root) + 1 :]
            for e in fs.get_file_info(pafs.FileSelector(root, recursive=True))
            if e.type == pafs.FileType.File
            and e.path.endswith(".parquet")
            and not any(s.startswith(("_", ".")) for s in e.path[len(root) + 1 :].split("/"))
        )
    if not files:
        raise StoreError(f"{uri}: no Parquet files (*.parquet) to adopt")
    uri = store.backend.uri(root)
    return AdoptionPlan(gallery, version, model, uri, root, files, id_column, embedding_column)


def _check_model(store: GalleryStore, gallery: str, model: str) -> None:
    catalog = Catalog(store)
    try:
        grant = catalog.queryable_version(gallery, model)
    except CorruptFileError:
        raise
    except StoreError:
        return
    raise StoreError(
        f"model {model!r} already queries gallery {gallery!r} at version "
        f"{grant.gallery_version!r} (grants are immutable); adopt under another model name"
    )


def _check_outside_store(store: GalleryStore, root: str, uri: str) -> None:
    base = store.backend.root
    if root == base or (
        root.startswith(base + "/")
        and any(s.startswith("_") for s in root[len(base) + 1 :].split("/"))
    ):
        raise StoreError(
            f"{uri} is inside the store's own folders, which its writers and gc manage; "
            f"adopt tables kept elsewhere"
        )


def _agree(plan: AdoptionPlan, reports: list[FileReport], key: str, what: str) -> object:
    """The value of ``key`` all (non-empty) files share; SchemaError naming two that differ."""
    seen = [r for r in reports if getattr(r, key) is not None]
    for report in seen[1:]:
        if getattr(report, key) != getattr(seen[0], key):
            raise SchemaError(
                f"{plan.uri}/{report.path} has {what} {getattr(report, key)} but "
                f"{plan.uri}/{seen[0].path} has {getattr(seen[0], key)}"
            )
    return getattr(seen[0], key) if seen else None


def summarize(
    plan: AdoptionPlan,
    reports: list[FileReport],
    *,
    normalized: bool | None = None,
    lineage: str | None = None,
) -> VersionInfo:
    """The version record the scanned files make: the files must agree on width, dtype and
    columns (an error names two that differ); rows and id fingerprint are their sums.

    Args:
        normalized: None: the version is ``normalized`` iff every row is unit-norm; True:
            required (SchemaError naming the first other row); False: not claimed.
    """
    width = _agree(plan, reports, "width", "embedding width")
    if width is None or sum(r.rows for r in reports) == 0:
        raise StoreError(f"{plan.uri}: the files hold no rows")
    dtype = _agree(plan, reports, "dtype", "embeddings of type")
    _agree(plan, reports, "columns", "columns")
    off = next(((r.path, r.not_unit_row) for r in reports if r.not_unit_row is not None), None)
    if normalized and off:
        raise SchemaError(f"{plan.uri}/{off[0]}: row {off[1]} is not unit-norm (normalized=True)")
    fingerprint = IdFingerprint()
    for report in reports:
        fingerprint = fingerprint.combine(report.ids)
    pins = [FilePin(r.path, r.bytes, r.rows, r.etag, r.mtime_ns) for r in reports]
    return VersionInfo(
        plan.version,
        plan.model,
        width,
        (off is None) if normalized is None else normalized,
        lineage or f"{plan.version} = adopt({plan.uri})",
        rows=fingerprint.count,
        files=list(plan.files),
        created=now_utc(),
        ids=fingerprint.to_dict(),
        dtype=dtype,
        external=ExternalFiles(plan.uri, pins, plan.id_column, plan.embedding_column).to_dict(),
    )


def publish_adopted(store: GalleryStore, plan: AdoptionPlan, info: VersionInfo) -> VersionInfo:
    """Create the record of ``info`` (create-if-absent, like every version), then register the
    model if it is new and grant it the version (``extracted``). Everything that can fail is
    checked before the record is written."""
    record = record_path(store.path(plan.gallery), plan.version)
    info = VersionInfo.from_json(info.to_json(), store.backend.uri(record))  # as readers see it
    catalog = Catalog(store)
    model = _model_record(catalog, plan.model, info.width)
    _check_model(store, plan.gallery, plan.model)
    try:
        store.backend.create_exclusive(record, info.to_json())
    except FileExistsError:
        raise PublishConflictError(
            f"{store.backend.uri(record)} was published by another writer first"
        ) from None
    catalog.register_model(model)
    evidence = {"adopted_from": plan.uri}
    catalog.grant(QueryGrant(plan.gallery, plan.version, plan.model, "extracted", evidence))
    return info


def _model_record(catalog: Catalog, model: str, width: int) -> ModelRecord:
    """The registered record of ``model`` (its width must be ``width``), or a new one for a
    model trained outside raycompat (no files: it can search with vectors, not images)."""
    try:
        record = catalog.model(model)
    except CorruptFileError:
        raise
    except StoreError:
        return ModelRecord(model, "", width, method="external")
    if record.embed_dim != width:
        raise SchemaError(
            f"model {model!r} embeds to {record.embed_dim}-d but the table holds {width}-d rows"
        )
    return record
