"""``adopt_version``: register an existing table (Delta, Iceberg, Parquet) as a version, in place.

    adopt_version(store, "faces", "v1", "s3://bucket/tables/faces", model="clip-b32",
                  id_column="image_id", embedding_column="vec")
    adopt_version(store, "faces", "v2", "iceberg:gallery.faces", model="clip-b32",
                  catalog_uri="sqlite:///path/catalog.db")

The driver finds the files (a Delta or Iceberg snapshot's data files, read through the format's
own library, or a plain folder's ``*.parquet``: ``raycompat/store/formats/snapshot.py``); Ray
tasks validate them (one task per group of files, each file streamed a batch at a time) and
return one constant-size report per file; Ray Data groups the ids to find any id held twice
(``unique.py``), unless the reports already prove them unique (ids increasing in each file,
file ranges disjoint); the driver then publishes the record from the reports. Nothing on the
driver grows with the rows. The core steps, and why the files are pinned, are in
``raycompat/store/formats/adopt.py`` and ``raycompat/store/formats/external.py``. A rerun of an
adoption whose record was published completes it (model record and grant) without Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
import ray

from raycompat.cluster.pipelines.unique import check_unique_distributed
from raycompat.io.filesystems import Backend
from raycompat.store import GalleryStore, StoreError, VersionInfo
from raycompat.store.formats import (
    AdoptionPlan,
    FileReport,
    plan_adoption,
    proven_unique,
    publish_adopted,
    register_adopted,
    scan_file,
    summarize,
)
from raycompat.store.paths import join

MAX_TASKS = 64  # files are scanned in at most this many Ray tasks


@dataclass
class TableFiles:
    """Where the adopted files are, as ``check_unique_distributed`` reads a staging area."""

    filesystem: pafs.FileSystem
    backend: Backend

    def uri_of(self, path: str) -> str:
        return self.backend.uri(path)


@ray.remote(num_cpus=1)
def _scan_files(
    store: GalleryStore, plan: AdoptionPlan, files: list[str], batch_size: int
) -> list[FileReport | StoreError]:
    """Scan ``files``; a file's validation error is returned (the driver raises it as is)."""
    out = []
    for rel in files:
        try:
            out.append(scan_file(store, plan, rel, batch_size))
        except StoreError as error:
            out.append(error)
    return out


def adopt_version(
    store: GalleryStore,
    gallery: str,
    version: str,
    uri: str,
    *,
    normalized: bool | None = None,
    lineage: str | None = None,
    batch_size: int = 65536,
    **source: Any,
) -> VersionInfo:
    """Publish the table at ``uri`` as ``gallery/version``, without copying.

    Args:
        uri: a local folder or file, or an ``s3://`` prefix or object, on the store's kind of
            filesystem (it is read with the store's credentials, now and by every reader): a
            Delta or Iceberg table (its current snapshot's data files) or a folder of
            ``*.parquet`` files. Hudi and Lance tables are refused. Or
            ``iceberg:<namespace>.<table>``: that table of the SQL catalog at ``catalog_uri``
            (``sqlite:///path/catalog.db``; ``warehouse`` its warehouse, optional), adopted
            from its location like a table folder; lineage names it
            (``adopt(iceberg:<namespace>.<table>@<snapshot>)``).
        source: :func:`plan_adoption`'s keywords (``model`` is required):
        as_of: a Delta version or Iceberg snapshot id, or an ISO timestamp: adopt that
            snapshot instead of the current one.
        model: the version's model; registered in the catalog if new (no files: it searches
            with vectors) and granted the version (``extracted``).
        id_column / embedding_column: the table's names for ``id`` and ``embedding``.
        normalized: None: set when every row is unit-norm; True: required; False: not set.
    Returns:
        the published record.
    Raises:
        StoreError: a file is unreadable, lacks a column, holds a row of another width, a
            null id or vector, NaN/inf, or an id another row holds (the error names the file
            and the row or id); the table's format or snapshot cannot be pinned as files
            (``UnsupportedTableError``: Hudi, Lance, deletion vectors, delete files); the
            version exists as another table or model (the error says what differs); the
            model's width differs; the catalog lacks the table (the error lists what it
            holds). Nothing is written then. The
            version existing as this same adoption (a killed run) is not an error: the
            missing model record and grant are written.
    """
    plan = plan_adoption(store, gallery, version, uri, **source)
    return run_adoption(store, plan, normalized=normalized, lineage=lineage, batch_size=batch_size)


def run_adoption(
    store: GalleryStore,
    plan: AdoptionPlan,
    *,
    normalized: bool | None = None,
    lineage: str | None = None,
    batch_size: int = 65536,
) -> VersionInfo:
    """Validate the files of ``plan`` (``plan_adoption``, no Ray) on Ray and publish them; a
    plan whose version is already published (``plan.published``) is completed without Ray."""
    if plan.published is not None:
        return register_adopted(store, plan, plan.published, normalized)
    per_task = -(-len(plan.files) // MAX_TASKS)
    groups = [plan.files[i : i + per_task] for i in range(0, len(plan.files), per_task)]
    store_ref, plan_ref = ray.put(store), ray.put(plan)
    results = ray.get([_scan_files.remote(store_ref, plan_ref, g, batch_size) for g in groups])
    reports = []
    for item in (item for group in results for item in group):
        if isinstance(item, StoreError):
            raise item
        reports.append(item)
    info = summarize(plan, reports, normalized=normalized, lineage=lineage)
    if not proven_unique(reports):
        paths = [join(plan.root, rel) for rel in plan.files]
        files = TableFiles(store.filesystem, store.backend)
        check_unique_distributed(files, paths, plan.id_column)
    return publish_adopted(store, plan, info)
