"""Adopting an existing Parquet table as a published version, in place: the core steps.

    plan = plan_adoption(store, "faces", "v1", "s3://bucket/tables/faces", model="clip-b32",
                         id_column="image_id", embedding_column="vec")
    reports = [scan_file(store, plan, rel) for rel in plan.files]   # adopt_scan.py, on Ray
    # ids unique across files, unless proven_unique(reports): Ray Data, cluster/pipelines/unique.py
    info = publish_adopted(store, plan, summarize(plan, reports))

``raycompat.cluster.pipelines.adopt.adopt_version`` runs these with the scans as Ray tasks; this
module
imports no Ray. Each scan (``adopt_scan.py``) streams one file and returns a constant-size
:class:`FileReport`: its pin (bytes, ETag or mtime), rows, id fingerprint, min/max id, width,
dtype. Nothing is written until every file has passed; then the record is created
create-if-absent, as for every version, and the model's record and query grant follow. The files
are never copied or changed.

A rerun completes a half-finished adoption (killed after the record, before the grant): when the
version exists and is the same adoption (:func:`adoption_differences`: same model, root, columns,
files, and each file's bytes and ETag or mtime as pinned), ``plan.published`` holds its record,
nothing is scanned again, and :func:`register_adopted` writes whatever of the model record and
grant is missing (the same content again is a no-op). Any difference is a
:class:`PublishConflictError` naming the version and what differs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from raycompat.errors import (
    PublishConflictError,
    SchemaError,
    StoreError,
    UsageError,
)
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.store.commit.part_record import IdFingerprint
from raycompat.store.commit.publish import publish_record, with_operation
from raycompat.store.formats.external import ExternalFiles, FilePin, stat_file
from raycompat.store.formats.snapshot import TableSnapshot, parse_as_of, read_snapshot
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import VersionInfo, now_utc, record_path
from raycompat.store.paths import check_name, join

CATALOG_PREFIX = "iceberg:"  # iceberg:<namespace>.<table>: a table of an SQL catalog


class AdoptOptionError(UsageError, StoreError):
    """A catalog option without a catalog-qualified name, or such a name without its catalog:
    a usage error (``raycompat adopt`` exits 2)."""


@dataclass
class AdoptionPlan:
    """What to adopt: ``files`` (relative to ``root``, a filesystem path; ``uri`` names it).
    For a Delta or Iceberg snapshot, ``table`` is ``{"format", "version"}`` and ``sizes`` the
    files' bytes as the table's log records them (``snapshot.py``); ``name`` is the
    ``iceberg:<namespace>.<table>`` a table was named by in its catalog."""

    gallery: str
    version: str
    model: str
    uri: str
    root: str
    files: list[str]
    id_column: str = "id"
    embedding_column: str = "embedding"
    published: VersionInfo | None = None  # the record of this same adoption, from a rerun
    table: dict | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    name: str | None = None

    def external(self) -> dict:
        return {"id_column": self.id_column, "embedding_column": self.embedding_column}

    @property
    def source(self) -> str:
        """What was adopted, for lineage: ``delta:<uri>@<version>``,
        ``iceberg:<namespace>.<table>@<snapshot>`` for a catalog's table, or the folder's uri."""
        if self.table is None:
            return self.uri
        return f"{self.name or self.table['format'] + ':' + self.uri}@{self.table['version']}"


@dataclass
class FileReport:
    """One file, as its scan found it (constant size, whatever the rows)."""

    path: str
    bytes: int
    rows: int
    etag: str | None
    mtime_ns: int | None
    ids: IdFingerprint
    min_id: int | str | None
    max_id: int | str | None
    width: int | None  # None: an empty file of variable-length lists
    dtype: str
    columns: list[str]  # "name: type" of every column but the embedding
    not_unit_row: int | None  # first row whose norm is not 1, None if all are
    ascending: bool  # ids strictly increasing through the file (so unique within it)


def plan_adoption(
    store: GalleryStore,
    gallery: str,
    version: str,
    uri: str,
    *,
    model: str,
    id_column: str = "id",
    embedding_column: str = "embedding",
    as_of: str | None = None,
    catalog_uri: str | None = None,
    warehouse: str | None = None,
) -> AdoptionPlan:
    """Check names, find the files of the table at ``uri`` (a folder, an S3 prefix or one
    file, or ``iceberg:<namespace>.<table>`` in the SQL catalog at ``catalog_uri``, with its
    ``warehouse``): a Delta or Iceberg snapshot's data files (the current one, or ``as_of``: a
    version or snapshot number, or an ISO timestamp), or a plain folder's ``*.parquet`` files;
    other table formats are refused (``snapshot.py``). Then check the version and the
    model's grant; fails before any data file is read (AdoptOptionError: catalog options that
    do not fit ``uri``).

    An existing version that is this same adoption (a rerun) sets ``published``; one that is
    not is a PublishConflictError naming what differs."""
    for kind, name in (("gallery", gallery), ("version", version), ("model", model)):
        check_name(kind, name)
    if id_column == embedding_column:
        raise SchemaError(f"the id and embedding columns are both {id_column!r}")
    root, snapshot = _find_table(store, uri, as_of, catalog_uri, warehouse)
    plan = AdoptionPlan(
        gallery,
        version,
        model,
        store.backend.uri(root),
        root,
        snapshot.files,
        id_column,
        embedding_column,
        table=snapshot.identity(),
        sizes=snapshot.sizes,
        name=uri if uri.startswith(CATALOG_PREFIX) else None,
    )
    plan.published = _published(store, plan)
    _check_model(store, gallery, model, version if plan.published else None)
    return plan


def _find_table(
    store: GalleryStore,
    uri: str,
    as_of: str | None,
    catalog_uri: str | None,
    warehouse: str | None,
) -> tuple[str, TableSnapshot]:
    """``(root, the snapshot's files relative to it)`` of the table at ``uri``."""
    if uri.startswith(CATALOG_PREFIX):
        return _catalog_table(store, uri, as_of, catalog_uri, warehouse)
    if catalog_uri or warehouse:
        raise AdoptOptionError(
            f"--catalog-uri and --warehouse apply to a table named iceberg:<namespace>.<table>; "
            f"{uri} is a folder or file"
        )
    root = _table_root(store, uri)
    fs = store.backend.filesystem
    found = fs.get_file_info(root)
    if found.type == pafs.FileType.NotFound:
        raise StoreError(f"{uri}: no such folder, prefix or file")
    if found.type != pafs.FileType.File:
        return root, read_snapshot(store, root, uri, as_of)
    if as_of is not None:
        raise StoreError(f"{uri}: --as-of applies to a table folder, not to one file")
    return root.rsplit("/", 1)[0], TableSnapshot("parquet", [root.rsplit("/", 1)[1]])


def _catalog_table(
    store: GalleryStore, uri: str, as_of: str | None, catalog_uri: str | None, warehouse: str | None
) -> tuple[str, TableSnapshot]:
    """The snapshot of the Iceberg table ``uri`` (``iceberg:<namespace>.<table>``) of the SQL
    catalog at ``catalog_uri``, pinned under the table's location."""
    from raycompat.store.formats import adopt_iceberg

    name = uri[len(CATALOG_PREFIX) :]
    if not catalog_uri:
        raise AdoptOptionError(
            f"{uri} names a table in an Iceberg catalog: give --catalog-uri "
            f"(sqlite:///path/catalog.db)"
        )
    if not name.rpartition(".")[0] or not name.rpartition(".")[2]:
        raise AdoptOptionError(f"{uri}: name an Iceberg table as iceberg:<namespace>.<table>")
    table = adopt_iceberg.load_catalog_table(store, name, catalog_uri, warehouse)
    root = _table_root(store, adopt_iceberg.location_uri(table.location()))
    moment = None if as_of is None else parse_as_of(as_of)
    return root, adopt_iceberg.table_snapshot(table, root, uri, moment)


def _table_root(store: GalleryStore, uri: str) -> str:
    """The filesystem path of the table at ``uri``, on the store's filesystem and outside it."""
    scheme, _, rest = uri.partition("://") if "://" in uri else ("file", "", uri)
    if scheme != store.backend.scheme:
        raise StoreError(
            f"{uri}: a {store.backend.scheme} store adopts only {store.backend.scheme} tables "
            f"(its readers open the files with the store's filesystem and credentials)"
        )
    root = os.path.abspath(rest) if scheme == "file" else rest.strip("/")
    _check_outside_store(store, root, uri)
    return root


def _published(store: GalleryStore, plan: AdoptionPlan) -> VersionInfo | None:
    """The version's record if it exists and is this adoption; None if it does not exist."""
    path = record_path(store.path(plan.gallery), plan.version)
    if store.backend.filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    info = store.version(plan.gallery, plan.version)
    return _same_adoption(
        store,
        plan,
        info,
        lambda differ: (
            f"gallery {plan.gallery!r} already has version {plan.version!r}, which "
            f"is not this adoption ({differ}); adopt under a new version name"
        ),
    )


def _same_adoption(
    store: GalleryStore, plan: AdoptionPlan, info: VersionInfo, refusal: Callable[[str], str]
) -> VersionInfo:
    """``info`` if it records this very adoption, else ``PublishConflictError`` whose message
    is ``refusal(what differs)``."""
    differ = adoption_differences(store, plan, info)
    if differ:
        raise PublishConflictError(refusal("; ".join(differ)))
    return info


def adoption_differences(store: GalleryStore, plan: AdoptionPlan, info: VersionInfo) -> list[str]:
    """What differs between the published ``info`` and adopting ``plan`` now, as
    ``"what <recorded>, now <found>"``; empty when it is the same adoption (the same model,
    root, id/embedding columns and files, each file still as pinned: bytes, ETag or mtime)."""
    if info.external is None:
        return [f"it is not an adopted version: {info.lineage}"]
    recorded = {
        "model": info.model_version,
        "root": info.external["root"],
        "table": info.external.get("table"),
        "id column": info.external["id_column"],
        "embedding column": info.external["embedding_column"],
    }
    found = {
        "model": plan.model,
        "root": plan.uri,
        "table": plan.table,
        "id column": plan.id_column,
        "embedding column": plan.embedding_column,
    }
    differ = [f"{k} {v!r}, now {found[k]!r}" for k, v in recorded.items() if v != found[k]]
    if info.files != plan.files:
        gone = sorted(set(info.files) - set(plan.files))
        new = sorted(set(plan.files) - set(info.files))
        differ.append(
            f"files: {len(info.files)} pinned, {len(plan.files)} now (missing "
            f"{gone[:3]}, new {new[:3]})"
        )
    return differ or _pin_differences(store, plan, info)


def _pin_differences(store: GalleryStore, plan: AdoptionPlan, info: VersionInfo) -> list[str]:
    differ = []
    for pin in info.external["pins"]:
        try:
            now = stat_file(store.backend, join(plan.root, pin["path"]))
        except FileNotFoundError:
            differ.append(f"{pin['path']} is gone")
            continue
        differ += [
            f"{pin['path']} {key} {pin[key]!r}, now {now[key]!r}"
            for key in ("bytes", "etag", "mtime_ns")
            if pin[key] is not None and pin[key] != now[key]
        ]
    return differ


def _check_model(store: GalleryStore, gallery: str, model: str, version: str | None) -> None:
    """Refuse a model that already queries the gallery, unless at ``version`` (a rerun)."""
    catalog = Catalog(store)
    grant = catalog.grant_of(gallery, model)
    if grant is None or grant.gallery_version == version:
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
    _check_sizes(plan, reports)
    fingerprint = IdFingerprint()
    for report in reports:
        fingerprint = fingerprint.combine(report.ids)
    pins = [FilePin(r.path, r.bytes, r.rows, r.etag, r.mtime_ns) for r in reports]
    return VersionInfo(
        plan.version,
        plan.model,
        width,
        (off is None) if normalized is None else normalized,
        lineage or f"{plan.version} = adopt({plan.source})",
        rows=fingerprint.count,
        files=list(plan.files),
        created=now_utc(),
        ids=fingerprint.to_dict(),
        dtype=dtype,
        external=ExternalFiles(
            plan.uri, pins, plan.id_column, plan.embedding_column, plan.table
        ).to_dict(),
    )


def _check_sizes(plan: AdoptionPlan, reports: list[FileReport]) -> None:
    """Each file of a table snapshot must have the size its log records (else it was
    rewritten in place, and is not the file the snapshot names)."""
    for report in reports:
        logged = plan.sizes.get(report.path, report.bytes)
        if report.bytes != logged:
            raise StoreError(
                f"{plan.uri}/{report.path} has {report.bytes} bytes, but {plan.source} records "
                f"{logged}: it was replaced in place; repair the table before adopting it"
            )


def publish_adopted(store: GalleryStore, plan: AdoptionPlan, info: VersionInfo) -> VersionInfo:
    """Create the record of ``info`` (:func:`publish_version`), then register the model if it is
    new and grant it the version (:func:`register_adopted`). Everything that can fail is checked
    before the record is written."""
    _model_record(Catalog(store), plan.model, info.width)
    _check_model(store, plan.gallery, plan.model, None)
    info = publish_version(store, plan, info)
    register_adopted(store, plan, info)
    return info


def publish_version(store: GalleryStore, plan: AdoptionPlan, info: VersionInfo) -> VersionInfo:
    """Create the version record of ``info``, create-if-absent like every version. If another
    writer created it first with this same adoption, its record is returned (nothing written);
    otherwise a PublishConflictError names what differs."""
    info = with_operation(info, "adopt", source=plan.source, files=len(plan.files))
    record = record_path(store.path(plan.gallery), plan.version)
    uri = store.backend.uri(record)
    store.register(plan.gallery)  # gc manages only marked stores' own galleries (marker.py)

    def same_adoption_or_conflict() -> VersionInfo:
        winner = store.version(plan.gallery, plan.version)
        return _same_adoption(
            store,
            plan,
            winner,
            lambda differ: (
                f"{uri} was published by another writer first, with other content ({differ})"
            ),
        )

    return publish_record(store.backend, record, info, same_adoption_or_conflict)


def register_adopted(
    store: GalleryStore, plan: AdoptionPlan, info: VersionInfo, normalized: bool | None = None
) -> VersionInfo:
    """Register the model (if new) and grant it the published version ``info`` (``extracted``),
    each create-if-absent: the same content again is a no-op, other content a one-line
    conflict naming what differs. ``normalized``, if given, must be what ``info`` says."""
    if normalized is not None and normalized != info.normalized:
        raise PublishConflictError(
            f"gallery {plan.gallery!r} already has version {plan.version!r} with normalized "
            f"{info.normalized}, not {normalized} as asked"
        )
    catalog = Catalog(store)
    catalog.register_model(_model_record(catalog, plan.model, info.width))
    evidence = {"adopted_from": plan.source}
    catalog.grant(QueryGrant(plan.gallery, plan.version, plan.model, "extracted", evidence))
    return info


def _model_record(catalog: Catalog, model: str, width: int) -> ModelRecord:
    """The registered record of ``model`` (its width must be ``width``), or a new one for a
    model trained outside raycompat (no weights: it searches with vectors, not images)."""
    return catalog.registered_or(ModelRecord(model, "", width, method="external"), "the table")
