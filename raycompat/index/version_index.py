"""A faiss index per store version, saved beside it, and queries that answer with ids.

Layout: ``<gallery>/_index/<version>/<build>/{index.faiss, index.faiss.json, ids.parquet}`` plus
the pointer ``<gallery>/_index/<version>.json``, replaced atomically once a build's files are all
written, so a reader loads either the previous build or the new one, never a mix. Indexes are
derived data: rebuilding replaces the pointer (old builds stay until deleted).

The pointer records each file's byte size and sha256, computed from the files as saved. A reader
checks its local copies against them before faiss parses anything (faiss may read a bit-flipped
file without complaint and answer wrong neighbours), so a corrupt index is never searched:
:func:`load_version_index` raises :class:`CorruptIndexError` naming the file, and
:func:`open_version_index` can rebuild instead. Pointers of earlier releases have no checksums;
they load unverified (a warning says so) until the index is rebuilt.

The index is built from :meth:`GalleryStore.iter_batches` (bounded memory): ``kind="auto"`` is an
exact ``flat`` index up to ``flat_max_rows`` rows and ``sharded_ivf`` above: an IVF built in
shards by parallel tasks and merged into on-disk inverted lists that searches memory-map
(:mod:`raycompat.index.sharded`, which also says what a load verifies). ``kind="ivfpq"``
builds an in-memory IVF-PQ, trained on ``train_size`` (default 100 000) rows sampled with
``seed`` (see :func:`raycompat.index.factory.build_index` for the IVF-PQ defaults).

Readers never write: :func:`open_search_index` (``raycompat search``) loads the published
index, and without a valid one searches exactly in memory (:func:`exact_version_index`) up to
``EXACT_SEARCH_MAX_ROWS`` rows; above that it is an :class:`IndexNeededError` naming
``raycompat index build``. Only :func:`build_version_index` (the jobs that publish),
``raycompat index build`` (:mod:`raycompat.index.measured_build`: :func:`stage_version_index`,
its recall measured, then :func:`publish_version_index` unless the published index is better)
and :func:`open_version_index` with ``rebuild=True`` write an index.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raycompat.errors import CorruptIndexError, MissingIndexError
from raycompat.index.distances import Distance, get_distance
from raycompat.index.factory import INDEX_KINDS, build_index
from raycompat.index.ivf import SHARDED_IVF
from raycompat.index.mapped_ids import MappedIds, int64_values
from raycompat.index.search_index import SearchIndex, real_hits
from raycompat.index.shard_tasks import MERGED_FILES
from raycompat.index.sharded import build_sharded_index, load_sharded_index
from raycompat.store.gallery import GalleryStore
from raycompat.store.maintenance.no_space import NoSpaceError, no_space_left
from raycompat.store.manifest import INDEX_DIR, VersionInfo
from raycompat.store.paths import check_name
from raycompat.store.read.vectors import vectors

logger = logging.getLogger(__name__)


class IndexNeededError(MissingIndexError):
    """A search needs the version's index: none is published (or it is corrupt) and the version
    is too large to search exactly in memory. The message names ``raycompat index build``."""


FLAT_MAX_ROWS = 100_000
EXACT_SEARCH_MAX_ROWS = 100_000  # rows an index-less search reads into memory (docs/store.md)
_FILES = ("index.faiss", "index.faiss.json", "ids.parquet")


@dataclass
class VersionIndex:
    """A loaded index of one version: ``search`` returns gallery ids, not row numbers.

    Attributes:
        ids: row number -> gallery id: an array (flat, ivfpq) or, for ``sharded_ivf``, a
            memory-mapped :class:`MappedIds` that materialises only the rows looked up.
        local_files: the local copy of a remote sharded build, deleted with this object.
        build: the published build it was loaded from; None for an exact in-memory index.
    """

    index: SearchIndex
    ids: np.ndarray | MappedIds
    info: VersionInfo
    local_files: tempfile.TemporaryDirectory | None = field(default=None, repr=False)
    build: str | None = None

    @property
    def source(self) -> str:
        """What answered, as search answers name it: ``build <id>`` or ``exact``."""
        return "exact" if self.build is None else f"build {self.build}"

    def search(
        self, queries: Any, k: int, nprobe: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k per query: ``scores (Q, k)`` (higher is better) and ``ids (Q, k)``.

        ``nprobe``: inverted lists visited (IVF kinds), default the build's. An approximate
        index that finds fewer than k items pads with score ``-inf`` and id ``None`` (string
        ids) or ``-1`` (int64 ids, where -1 may also be a real id): :meth:`hits` returns only
        what was found.
        """
        scores, rows = self.index.search(queries, k, nprobe=nprobe)
        missing = None if self.ids.dtype == object else -1
        return scores, np.where(rows >= 0, self.ids[np.maximum(rows, 0)], missing)

    def hits(
        self, queries: Any, k: int, nprobe: int | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Only the items found, per query: a list of ``(scores (n,), ids (n,))``, best first.

        ``n <= k``: ``n`` is smaller where ``k`` exceeds the version's rows (every row is then
        returned) or an IVF index's probed lists hold fewer than ``k`` items (``nprobe``, as
        in :meth:`search`, visits more). faiss's padding is dropped by its row label (-1)
        before rows map to ids, so an int64 id -1 is a real hit.
        """
        scores, rows = self.index.search(queries, min(int(k), self.index.ntotal), nprobe)
        return real_hits(scores, rows, self.ids)

    def holds_vectors(self) -> bool:
        """Whether the index keeps every row's vector as stored (``flat``, and the exact
        in-memory index): :meth:`vectors_of` reads them from memory."""
        return self.index.kind == "flat" and isinstance(self.ids, np.ndarray)

    def vectors_of(self, ids: list, order: np.ndarray) -> tuple[np.ndarray | None, list]:
        """``(vectors (len(ids), d) in ``ids`` order, [])`` from the index itself, or ``(None,
        the ids no row holds)``; ``ids`` of the version's id type, ``order`` =
        ``np.argsort(self.ids)`` (computed once by the caller). Only where
        :meth:`holds_vectors`: a flat index's rows are the stored vectors (normalised for a
        cosine version, as its search normalises queries)."""
        wanted = np.asarray(ids, dtype=self.ids.dtype)
        at = np.searchsorted(self.ids, wanted, sorter=order).clip(max=len(order) - 1)
        rows = order[at]
        found = self.ids[rows] == wanted
        if not found.all():
            return None, [i for i, ok in zip(ids, found.tolist(), strict=True) if not ok]
        return self.index.index.reconstruct_batch(rows.astype(np.int64)), []


def _vectors(batch: pa.RecordBatch, width: int) -> np.ndarray:
    # float16 versions are searched as float32 (faiss's input type)
    return vectors(batch, "embedding").reshape(-1, width)


def rows_at(
    store: GalleryStore, gallery: str, info: VersionInfo, rows: np.ndarray, batch_size: int
) -> np.ndarray:
    """The version's vectors at the sorted row numbers ``rows``, ``(len(rows), d)``, streamed
    batch by batch (memory: one batch and the picked rows)."""
    out, start = [], 0
    for batch in store.iter_batches(gallery, info.version, batch_size, columns=["embedding"]):
        picked = rows[(rows >= start) & (rows < start + batch.num_rows)] - start
        out.append(_vectors(batch, info.width)[picked])
        start += batch.num_rows
    return np.concatenate(out)


def _sample(
    store: GalleryStore, gallery: str, info: VersionInfo, size: int, seed: int, batch_size: int
) -> np.ndarray:
    rows = np.sort(np.random.default_rng(seed).choice(info.rows, size=size, replace=False))
    return rows_at(store, gallery, info, rows, batch_size)


def build_version_index(store: GalleryStore, gallery: str, version: str, **options: Any) -> str:
    """Build, save and publish the index of ``gallery/version``; return the build's URI.

    ``options``: as :func:`stage_version_index`. ``raycompat index build`` publishes through
    :func:`raycompat.index.measured_build.build_measured_index` instead, which measures the new
    build's recall first and keeps a better published index.
    """
    pointer = stage_version_index(store, gallery, version, **options)
    return publish_version_index(store, gallery, store.version(gallery, version), pointer)


def stage_version_index(
    store: GalleryStore,
    gallery: str,
    version: str,
    *,
    distance: str | None = None,
    kind: str = "auto",
    flat_max_rows: int = FLAT_MAX_ROWS,
    train_size: int | None = None,
    batch_size: int = 65536,
    seed: int = 0,
    use_gpu: bool | str = "auto",
    **options: Any,
) -> dict:
    """Build and save the index of ``gallery/version`` in a build folder of its own; return the
    pointer that :func:`publish_version_index` publishes (nothing is published here).

    Args:
        distance: default ``"cosine"`` for a ``normalized`` version, ``"l2"`` (FCT) otherwise.
        kind: ``"auto"`` (``flat`` up to ``flat_max_rows`` rows, ``sharded_ivf`` above),
            ``"flat"``, ``"ivfpq"`` or ``"sharded_ivf"``.
        options: ivfpq: ``nlist``, ``m``, ``nbits``, ``nprobe`` passed to ``build_index``;
            sharded_ivf: ``runner``, ``nlist``, ``nprobe``, ``rows_per_shard``, ``build``,
            ``keep_shards`` (:func:`~raycompat.index.sharded.build_sharded_index`).
    """
    info = store.version(gallery, version)
    dist = get_distance(distance or default_distance(info))
    kind = resolve_kind(info, kind, flat_max_rows)
    if kind == SHARDED_IVF:  # built by tasks into its own folder: no in-memory index here
        return build_sharded_index(
            store,
            gallery,
            info,
            dist,
            train_size=train_size,
            batch_size=batch_size,
            seed=seed,
            use_gpu=use_gpu,
            **options,
        )
    index, ids = _index_rows(
        store, gallery, info, dist, kind, train_size or 100_000, batch_size, seed, use_gpu, options
    )
    build = uuid.uuid4().hex
    prefix = store.path(gallery, INDEX_DIR, version, build)
    with tempfile.TemporaryDirectory() as tmp:  # a full temporary disk: removed with it
        try:
            index.save(Path(tmp, "index.faiss"))
            pq.write_table(pa.table({"id": ids}), Path(tmp, "ids.parquet"))
        except (OSError, RuntimeError) as error:  # faiss reports a write error as RuntimeError
            if not no_space_left(error):
                raise
            raise NoSpaceError(
                f"{tmp}: no space left on device; the index is staged in the temporary folder "
                "before it is copied to the store: free space there or set TMPDIR"
            ) from None
        files = {name: _file_record(Path(tmp, name)) for name in _FILES}
        _copy_build(store, tmp, prefix)
    return {
        "build": build,
        "kind": kind,
        "distance": dist.name,
        "rows": index.ntotal,
        "files": files,
    }


def _copy_build(store: GalleryStore, local: str, prefix: str) -> None:
    """Copy the build's files from the folder ``local`` to the build folder ``prefix``; on a
    full disk, delete that folder (named by this build's own uuid: no pointer names it, no
    other build writes there) and raise :class:`NoSpaceError` naming the file."""
    if store.filesystem.type_name == "local":
        store.filesystem.create_dir(prefix, recursive=True)
    for name in _FILES:
        try:
            pafs.copy_files(
                str(Path(local, name)),
                f"{prefix}/{name}",
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=store.filesystem,
            )
        except OSError as error:
            if not no_space_left(error):
                raise
            store.filesystem.delete_dir(prefix)
            raise NoSpaceError(
                f"{store.backend.uri(f'{prefix}/{name}')}: no space left on device; the index "
                "was not published and this build's partial files were removed"
            ) from None


def default_distance(info: VersionInfo) -> str:
    """``cosine`` for a ``normalized`` version, ``l2`` (FCT) otherwise."""
    return "cosine" if info.normalized else "l2"


def resolve_kind(info: VersionInfo, kind: str, flat_max_rows: int = FLAT_MAX_ROWS) -> str:
    """The index kind a build of ``info`` makes: ``auto`` is ``flat`` up to ``flat_max_rows``
    rows and ``sharded_ivf`` above; an unknown kind fails, listing the valid ones."""
    kind = ("flat" if info.rows <= flat_max_rows else SHARDED_IVF) if kind == "auto" else kind
    INDEX_KINDS.get(kind)
    return kind


def _index_rows(
    store: GalleryStore,
    gallery: str,
    info: VersionInfo,
    dist: Distance,
    kind: str,
    train_size: int,
    batch_size: int,
    seed: int,
    use_gpu: bool | str,
    ivfpq: dict,
) -> tuple[SearchIndex, pa.Array]:
    """An in-memory ``flat`` or ``ivfpq`` index of every row of the version, in store order,
    and the ids of its rows. ``ivfpq``: ``nlist``, ``m``, ``nbits``, ``nprobe``."""
    index = None
    if kind != "flat":
        sample = _sample(store, gallery, info, min(train_size, info.rows), seed, batch_size)
        index = build_index(sample, dist, kind, use_gpu=use_gpu, seed=seed, **ivfpq)
        index.index.reset()  # keep the trained quantisers, add every row in store order below
    ids = []
    for batch in store.iter_batches(gallery, info.version, batch_size, ["id", "embedding"]):
        x = _vectors(batch, info.width)
        if index is None:
            index = build_index(x, dist, kind, use_gpu=use_gpu, **ivfpq)
        else:
            index.index.add(np.ascontiguousarray(dist.prepare_numpy(x, "gallery"), np.float32))
        ids.append(batch.column("id"))
    return index, pa.concat_arrays(ids)


def publish_version_index(
    store: GalleryStore, gallery: str, info: VersionInfo, pointer: dict
) -> str:
    """Replace the version's pointer with ``pointer`` (from :func:`stage_version_index`); return
    the build's URI."""
    version, build = info.version, pointer["build"]
    store.backend.replace(_pointer_path(store, gallery, version), json.dumps(pointer).encode())
    logger.info(
        "indexed %s/%s: %s %s over %d rows",
        gallery,
        version,
        pointer["kind"],
        pointer["distance"],
        info.rows,
    )
    return store.uri(gallery, INDEX_DIR, version, build)


def _pointer_path(store: GalleryStore, gallery: str, version: str) -> str:
    return store.path(
        check_name("gallery", gallery), INDEX_DIR, f"{check_name('version', version)}.json"
    )


def _file_record(path: Path) -> dict:
    """``{"bytes": size, "sha256": hex digest}`` of a local file (streamed, not held in memory)."""
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256")
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _read_pointer(store: GalleryStore, path: str, gallery: str, version: str) -> dict:
    source = store.backend.uri(path)
    try:
        pointer = json.loads(store.backend.read(path))  # re-pointed in place: read it whole
        check_name("index build", pointer["build"])
        files = pointer.get("files")
        if files is not None:
            for name in _files_of(pointer):
                record = files[name]
                if not isinstance(record["bytes"], int) or not isinstance(record["sha256"], str):
                    raise TypeError(f"files[{name!r}] must hold an int 'bytes' and a str 'sha256'")
    except FileNotFoundError:
        raise MissingIndexError(
            f"{source}: no index for {gallery}/{version}; build it: raycompat index build "
            f"{gallery} --version {version} --store {store.uri()}"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CorruptIndexError(
            f"{source}: unreadable index pointer ({error!r}); rebuild the index"
        ) from None
    return pointer


def published_pointer(store: GalleryStore, gallery: str, version: str) -> dict | None:
    """The version's published pointer, or None when no index is published.

    Raises:
        CorruptIndexError: the pointer is unreadable.
    """
    try:
        return _read_pointer(store, _pointer_path(store, gallery, version), gallery, version)
    except MissingIndexError:
        return None


def pointer_bytes(store: GalleryStore, gallery: str, version: str) -> bytes | None:
    """The version's pointer as stored (None: no index is published): one small read, no
    parse. A publish replaces the pointer, so other bytes mean another index (a first build,
    a rebuild, a ``sharded_ivf`` build rewritten in place with new checksums); a reader that
    loaded an index after reading these bytes follows a build by comparing them
    (``raycompat/service/served.py``)."""
    try:
        return store.backend.read(_pointer_path(store, gallery, version))
    except FileNotFoundError:
        return None


def pointer_uri(store: GalleryStore, gallery: str, version: str) -> str:
    """The URI of the version's pointer (named in messages)."""
    return store.backend.uri(_pointer_path(store, gallery, version))


def _files_of(pointer: dict) -> tuple[str, ...]:
    return MERGED_FILES if pointer.get("kind") == SHARDED_IVF else _FILES


def _verify(local: Path, expected: dict, uri: str) -> None:
    # Size first: a truncated upload is the common case and says more than a digest mismatch.
    size = local.stat().st_size
    if size != expected["bytes"]:
        raise CorruptIndexError(
            f"{uri}: expected {expected['bytes']} bytes, found {size} (truncated or overwritten); "
            f"rebuild the index"
        )
    found = _file_record(local)["sha256"]
    if found != expected["sha256"]:
        raise CorruptIndexError(
            f"{uri}: expected sha256 {expected['sha256']}, found {found}; rebuild the index"
        )


def load_version_index(
    store: GalleryStore,
    gallery: str,
    version: str,
    use_gpu: bool | str = "auto",
    verify: str = "auto",
) -> VersionIndex:
    """Load the current index build of ``gallery/version``, verified before faiss reads it.

    Args:
        verify: ``"auto"``: every file's size and sha256, except that a ``sharded_ivf`` build's
            data files (O(N) bytes) are checked by size only; ``"full"``: sha256 of those too.
            A ``sharded_ivf`` build stays on the CPU, memory-mapped, unless ``use_gpu=True``.
    Raises:
        MissingIndexError: no index was built for the version.
        CorruptIndexError: the pointer is unreadable, or a file of the build is missing, differs
            from the size or sha256 the build recorded, cannot be parsed, or disagrees with the
            version (rows, width). The message names the file.
    """
    info, path = store.version(gallery, version), _pointer_path(store, gallery, version)
    pointer = _read_pointer(store, path, gallery, version)
    source = store.backend.uri(path)
    return load_pointer_index(store, gallery, info, pointer, source, use_gpu, verify)


def load_pointer_index(
    store: GalleryStore,
    gallery: str,
    info: VersionInfo,
    pointer: dict,
    source: str,
    use_gpu: bool | str = "auto",
    verify: str = "auto",
) -> VersionIndex:
    """:func:`load_version_index` of the build ``pointer`` names, published or only staged
    (:func:`stage_version_index`); ``source`` names the pointer in messages."""
    version = info.version
    build, files = pointer["build"], pointer.get("files")
    if files is None:
        logger.warning(
            "%s: build %s records no checksums (an earlier release wrote it); loading it "
            "unverified, rebuild the index to add them",
            source,
            build,
        )
    prefix = store.path(gallery, INDEX_DIR, version, build)
    if pointer.get("kind") == SHARDED_IVF:
        if files is None:
            raise CorruptIndexError(f"{source}: a {SHARDED_IVF} pointer without files")
        index, ids, local = load_sharded_index(
            store, prefix, pointer, verify=verify, use_gpu=use_gpu
        )
        _check_matches(index, len(ids), info, source, version)
        return VersionIndex(index, ids, info, local, build)
    uris = {name: store.backend.uri(f"{prefix}/{name}") for name in _FILES}
    with tempfile.TemporaryDirectory() as tmp:
        for name in _FILES:
            try:
                pafs.copy_files(
                    f"{prefix}/{name}",
                    str(Path(tmp, name)),
                    source_filesystem=store.filesystem,
                    destination_filesystem=pafs.LocalFileSystem(),
                )
            except FileNotFoundError:
                raise CorruptIndexError(
                    f"{uris[name]}: missing, though {source} names build {build}; rebuild the index"
                ) from None
            if files is not None:
                _verify(Path(tmp, name), files[name], uris[name])
        try:  # parse on the CPU, so that a failure here is the file's and not the GPU's
            index = SearchIndex.load(Path(tmp, "index.faiss"), use_gpu=False)
        except (RuntimeError, ValueError, KeyError) as error:
            raise CorruptIndexError(
                f"{uris['index.faiss']} (or its .json): faiss cannot read it ({error}); "
                f"rebuild the index"
            ) from None
        try:
            # ParquetFile, not read_table: pyarrow.dataset would import pandas (~0.2 s of a CLI)
            ids = pq.ParquetFile(Path(tmp, "ids.parquet")).read(columns=["id"]).column("id")
        except (pa.ArrowException, ValueError, KeyError) as error:
            raise CorruptIndexError(
                f"{uris['ids.parquet']}: unreadable ({error}); rebuild the index"
            ) from None
    _check_matches(index, len(ids), info, source, version)
    index.place(use_gpu)
    return VersionIndex(index, _id_array(ids.combine_chunks()), info, build=build)


def _id_array(ids: pa.Array) -> np.ndarray:
    """int64 ids as an int64 array, string ids as an object array (not ``to_numpy``, which
    imports pandas: a CLI search of a flat index needs none)."""
    if pa.types.is_integer(ids.type):
        return int64_values(ids)
    return np.array(ids.to_pylist(), dtype=object)


def _check_matches(index: SearchIndex, ids: int, info: VersionInfo, source: str, version: str):
    if not index.ntotal == ids == info.rows or index.dim != info.width:
        raise CorruptIndexError(
            f"{source}: index of {index.ntotal} x {index.dim} with {ids} ids does not match "
            f"version {version} ({info.rows} x {info.width}); rebuild the index"
        )


def open_version_index(
    store: GalleryStore,
    gallery: str,
    version: str,
    *,
    rebuild: bool,
    use_gpu: bool | str = "auto",
    verify: str = "auto",
    **build_options: Any,
) -> VersionIndex:
    """:func:`load_version_index`, building a fresh index when none exists or it is corrupt.

    Args:
        rebuild: whether a missing or corrupt index may be (re)built from the version with
            :func:`build_version_index` (``build_options`` go to it). The corrupt build's files
            stay for inspection; the pointer moves to the new build (a ``sharded_ivf`` rebuild
            with the same parameters continues its build folder instead: intact shards are
            kept, the merged files are rewritten). False: raise instead.
        verify: as :func:`load_version_index`.
    Raises:
        MissingIndexError, CorruptIndexError: as :func:`load_version_index`, when not
            ``rebuild``.
    """
    try:
        return load_version_index(store, gallery, version, use_gpu=use_gpu, verify=verify)
    except MissingIndexError:
        if not rebuild:
            raise
        logger.info("no index for %s/%s yet: building it", gallery, version)
    except CorruptIndexError as error:
        if not rebuild:
            raise
        logger.warning("rebuilding the index of %s/%s: %s", gallery, version, error)
    build_version_index(store, gallery, version, use_gpu=use_gpu, **build_options)
    return load_version_index(store, gallery, version, use_gpu=use_gpu, verify=verify)


def exact_version_index(
    store: GalleryStore, gallery: str, version: str, use_gpu: bool | str = False
) -> VersionIndex:
    """An exact ``flat`` index of the version held in memory only: nothing is written.

    Reads every row (``rows x width`` float32s), so meant for small versions; the distance is
    the one a build would use (:func:`default_distance`)."""
    info = store.version(gallery, version)
    dist = get_distance(default_distance(info))
    index, ids = _index_rows(store, gallery, info, dist, "flat", info.rows, 65536, 0, use_gpu, {})
    return VersionIndex(index, _id_array(ids), info)


def open_search_index(
    store: GalleryStore,
    gallery: str,
    version: str,
    *,
    exact_max_rows: int = EXACT_SEARCH_MAX_ROWS,
    use_gpu: bool | str = "auto",
) -> tuple[VersionIndex, str | None]:
    """The index a reader searches, without writing anything to the store.

    Returns:
        the published index (verified as :func:`load_version_index` does) and None; or, when
        none is published or it fails verification, an exact in-memory index of the version
        (:func:`exact_version_index`) and a one-line note saying why.
    Raises:
        IndexNeededError: no valid index and more than ``exact_max_rows`` rows.
    """
    try:
        return load_version_index(store, gallery, version, use_gpu=use_gpu), None
    except MissingIndexError:
        why = "no index is published"
    except CorruptIndexError as error:
        why = f"its index is unusable ({error})"
    info = store.version(gallery, version)
    build = f"raycompat index build {gallery} --version {version} --store {store.uri()}"
    if info.rows > exact_max_rows:
        raise IndexNeededError(
            f"{gallery}/{version}: {why}, and its {info.rows} rows exceed the "
            f"{exact_max_rows} an exact search reads into memory; build the index: {build}"
        )
    note = f"{gallery}/{version}: {why}; searched its {info.rows} rows exactly ({build} makes one)"
    return exact_version_index(store, gallery, version), note
