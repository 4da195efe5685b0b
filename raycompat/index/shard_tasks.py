"""The work of a sharded IVF build that runs on workers: sample, verify, add, merge.

Every function here takes a picklable :class:`ShardContext` and opens the store itself, so a
:class:`~raycompat.index.tasks.TaskRunner` can ship it to any process (a Ray task, or this one:
``LocalTasks``). The driver (``sharded.py``) plans and publishes; it never sees a vector of the
version (the training sample goes to the build folder and is read by the training task), nor
an id.

Files of one build, under ``<gallery>/_index/<version>/<build>/``::

    _template.faiss     the trained, empty IVF (coarse quantizer) every shard is added to
    _sample/shard-NNNNN.npy     a shard's rows of the training sample (removed once trained)
    _shards/shard-NNNNN.faiss   one IVF index per group of part files, labels = global rows
    _shards/shard-NNNNN.json    its record: rows, first row, template sha256, bytes, sha256,
                                and the task's seconds per phase (``SHARD_PHASES``)
    index.faiss, index.ivfdata  the merged index: header + on-disk inverted lists
    ids.parquet, ids.arrow      gallery ids in row order (Parquet; Arrow IPC to memory-map)

A shard's record is written after its file, so a record whose file has its size and sha256
means "shard done"; anything else is redone by a rerun.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raycompat.errors import CorruptIndexError, ManifestError
from raycompat.index.distances import get_distance
from raycompat.index.factory import INDEX_KINDS
from raycompat.index.gpu import resolve_gpu
from raycompat.index.ivf import SHARDED_IVF, quantizer_ef
from raycompat.index.stdout import stdout_to_stderr
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import INDEX_DIR, VersionInfo
from raycompat.store.read.parquet import iter_file_batches
from raycompat.store.schema import validate_schema, validate_values

TEMPLATE, SHARDS_DIR, SAMPLE_DIR = "_template.faiss", "_shards", "_sample"
# Where an add task's time went, in its shard's record ("seconds"): reading, validating and
# preparing the rows; faiss' add (assigning each row to a list, appending it); writing the shard
# file, hashing it and moving it into the store.
SHARD_PHASES = ("read", "add", "write")
MERGED_FILES = ("index.faiss", "index.faiss.json", "index.ivfdata", "ids.parquet", "ids.arrow")
IDS_BATCH_ROWS = 1 << 20


@dataclass(frozen=True)
class Shard:
    """A run of consecutive part files of the version; rows ``[first_row, first_row + rows)``.

    Attributes:
        files: the version's files as its record lists them (``info.files`` order): relative
            to the gallery, or to the ``external`` root of an adopted version.
        file_rows: rows of each file, from its footer when planned.
    """

    number: int
    first_row: int
    files: tuple[str, ...]
    file_rows: tuple[int, ...]

    @property
    def rows(self) -> int:
        return sum(self.file_rows)

    @property
    def name(self) -> str:
        return f"shard-{self.number:05d}"


@dataclass(frozen=True)
class ShardContext:
    """Everything a worker needs to find the version and the build (picklable)."""

    root: str
    storage_options: dict | None
    gallery: str
    info: VersionInfo
    build: str
    distance: str
    batch_size: int
    threads: int | None = None  # faiss OpenMP threads in the worker (None: faiss' default)

    def open(self) -> GalleryStore:
        if self.threads:
            faiss.omp_set_num_threads(self.threads)
        return GalleryStore(self.root, self.storage_options)

    def path(self, store: GalleryStore, *names: str) -> str:
        return store.path(self.gallery, INDEX_DIR, self.info.version, self.build, *names)


def file_record(path: str | Path) -> dict:
    """``{"bytes": size, "sha256": hex digest}`` of a local file (streamed)."""
    with open(path, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256")
    return {"bytes": os.path.getsize(path), "sha256": digest.hexdigest()}


def store_sha256(store: GalleryStore, path: str) -> str:
    """sha256 of a file in the store, streamed in 4 MiB blocks."""
    digest = hashlib.sha256()
    with store.filesystem.open_input_stream(path) as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def workdir(store: GalleryStore, ctx: ShardContext) -> tempfile.TemporaryDirectory:
    """Scratch space: inside the build folder on a local store (so ``put`` is a rename on the
    same filesystem), the machine's temporary folder otherwise."""
    if store.backend.scheme != "file":
        return tempfile.TemporaryDirectory(prefix="raycompat-index-")
    os.makedirs(ctx.path(store), exist_ok=True)
    return tempfile.TemporaryDirectory(prefix="_work-", dir=ctx.path(store))


def put(store: GalleryStore, local: str, path: str) -> None:
    """Move a finished local file to ``path`` in the store: an atomic rename locally (a reader
    holding the old file memory-mapped keeps it), a whole-object upload on S3."""
    if store.backend.scheme == "file":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.replace(local, path)
        return
    pafs.copy_files(
        local,
        path,
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=store.filesystem,
    )


def local_copy(store: GalleryStore, path: str, folder: str) -> str:
    """A local path of ``path``: itself on a local store, a copy in ``folder`` otherwise."""
    if store.backend.scheme == "file":
        return path
    out = os.path.join(folder, os.path.basename(path))
    pafs.copy_files(
        path, out, source_filesystem=store.filesystem, destination_filesystem=pafs.LocalFileSystem()
    )
    return out


def read_template(store: GalleryStore, ctx: ShardContext, sha256: str, folder: str):
    """The trained empty IVF, checked against the sha256 the driver recorded for it."""
    path = ctx.path(store, TEMPLATE)
    local = local_copy(store, path, folder)
    found = file_record(local)["sha256"]
    if found != sha256:
        raise CorruptIndexError(
            f"{store.backend.uri(path)}: expected sha256 {sha256}, found {found} (retrained "
            f"by another run?); rerun the build"
        )
    return faiss.read_index(local)


def version_paths(store: GalleryStore, gallery: str, info: VersionInfo) -> dict:
    """``{file as the record lists it: (filesystem path, URI)}``, resolved as the store does
    (an adopted version's files lie under its ``external`` root, not in the gallery)."""
    return dict(zip(info.files, store.version_files(gallery, info), strict=True))


def iter_shard_vectors(
    store: GalleryStore, ctx: ShardContext, shard: Shard
) -> Iterator[np.ndarray]:
    """The shard's rows as float32 ``(B, d)`` batches, prepared for the distance, validated."""
    dist, info = get_distance(ctx.distance), ctx.info
    paths = version_paths(store, ctx.gallery, info)
    for rel, planned in zip(shard.files, shard.file_rows, strict=True):
        path, source = paths[rel]
        with store.open_file(info, path, source) as parquet:
            validate_schema(parquet.schema_arrow, info, source)
            if parquet.metadata.num_rows != planned:
                raise ManifestError(
                    f"{source}: holds {parquet.metadata.num_rows} rows, {planned} when the "
                    f"index build was planned"
                )
            batches = iter_file_batches(parquet, source, ctx.batch_size, ["embedding"])
            for batch, offset in batches:
                validate_values(batch, info, source, offset)
                flat = batch.column("embedding").flatten().to_numpy()
                x = flat.astype(np.float32, copy=False).reshape(-1, info.width)  # float16 too
                # NumPy, not torch: a worker of the build never imports torch (~3 s a process)
                yield np.ascontiguousarray(dist.prepare_numpy(x, "gallery"), np.float32)


def sample_shard(ctx: ShardContext, shard: Shard, rows: np.ndarray) -> np.ndarray:
    """Prepared vectors of the sorted global ``rows`` (all within the shard): ``(len(rows), d)``."""
    store, out, start = ctx.open(), [], shard.first_row
    for x in iter_shard_vectors(store, ctx, shard):
        picked = rows[(rows >= start) & (rows < start + len(x))] - start
        out.append(x[picked])
        start += len(x)
    return np.concatenate(out)


def write_sample(ctx: ShardContext, shard: Shard, rows: np.ndarray) -> str:
    """:func:`sample_shard`, saved as ``_sample/<shard>.npy`` in the build folder; its path."""
    store = ctx.open()
    path = ctx.path(store, SAMPLE_DIR, f"{shard.name}.npy")
    with workdir(store, ctx) as work:
        local = os.path.join(work, f"{shard.name}.npy")
        np.save(local, sample_shard(ctx, shard, rows))
        put(store, local, path)
    return path


def read_sample(store: GalleryStore, paths: list[str]) -> np.ndarray:
    """The training sample from the files :func:`write_sample` wrote, in ``paths`` order."""
    parts = []
    for path in paths:
        with store.filesystem.open_input_stream(path) as handle:
            parts.append(np.load(io.BytesIO(handle.read()), allow_pickle=False))
    return np.concatenate(parts)


@dataclass(frozen=True)
class Training:
    """What the k-means task trains: ``nlist`` lists (``quantizer``: ``"flat"`` or ``"hnsw"``,
    resolved by the driver), default ``nprobe``, ``seed``, ``use_gpu``, and ``threads``: faiss
    threads of the task (the node's CPUs it reserved; None: the task's share)."""

    nlist: int
    nprobe: int
    seed: int
    use_gpu: bool | str
    quantizer: str = "flat"
    threads: int | None = None


def train_template(ctx: ShardContext, samples: list[str], training: Training) -> dict:
    """A task: k-means on the sample files, the trained empty IVF saved as the build's template;
    returns its record (with the quantizer it holds). It runs where the runner puts it, so the
    driver never holds the sample (``64 nlist`` rows: 4.3 GB at 10^9 rows of 256-d); GPU k-means
    when faiss sees a GPU there and ``use_gpu`` allows it, else on ``training.threads`` threads."""
    store = ctx.open()
    before = faiss.omp_get_max_threads()
    if training.threads:
        faiss.omp_set_num_threads(training.threads)
    try:
        train = read_sample(store, samples)
        index = INDEX_KINDS.create(
            SHARDED_IVF,
            dim=ctx.info.width,
            metric=get_distance(ctx.distance).faiss_metric,
            train=train,
            seed=training.seed,
            nlist=training.nlist,
            quantizer=training.quantizer,
        )
        index.nprobe = training.nprobe
        if resolve_gpu(training.use_gpu):  # GPU k-means: assignment there, centroids on the CPU
            width = ctx.info.width
            index.clustering_index = faiss.index_cpu_to_all_gpus(faiss.IndexFlatL2(width))
        index.train(train)
        index.clustering_index = None
    finally:
        faiss.omp_set_num_threads(before)
    with workdir(store, ctx) as work:
        local = os.path.join(work, TEMPLATE)
        faiss.write_index(index, local)
        record = {**file_record(local), "nlist": training.nlist, "train_rows": int(len(train))}
        if training.quantizer != "flat":  # a flat template's record is as it always was
            record["quantizer"] = training.quantizer
        put(store, local, ctx.path(store, TEMPLATE))
    return record


def _shard_paths(store: GalleryStore, ctx: ShardContext, shard: Shard) -> tuple[str, str]:
    return (
        ctx.path(store, SHARDS_DIR, f"{shard.name}.faiss"),
        ctx.path(store, SHARDS_DIR, f"{shard.name}.json"),
    )


def verify_shard(ctx: ShardContext, shard: Shard, template_sha256: str) -> str | None:
    """None if the shard's file and record are complete and belong to this plan and template;
    otherwise why not (the driver logs it and rebuilds the shard)."""
    store = ctx.open()
    path, record_path = _shard_paths(store, ctx, shard)
    try:
        record = json.loads(store.backend.read(record_path))
        expected = {
            "shard": shard.number,
            "first_row": shard.first_row,
            "rows": shard.rows,
            "template_sha256": template_sha256,
        }
        mismatch = {k: record.get(k) for k, v in expected.items() if record.get(k) != v}
        if mismatch:
            return f"{store.backend.uri(record_path)} records {mismatch}, expected {expected}"
        size = store.filesystem.get_file_info(path).size
        if size != record["bytes"]:
            return f"{store.backend.uri(path)}: expected {record['bytes']} bytes, found {size}"
        found = store_sha256(store, path)
        if found != record["sha256"]:
            return f"{store.backend.uri(path)}: expected sha256 {record['sha256']}, found {found}"
    except FileNotFoundError as error:
        return f"missing ({error})"
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{store.backend.uri(record_path)}: unreadable record ({error!r})"
    return None


def build_shard(ctx: ShardContext, shard: Shard, template_sha256: str) -> dict:
    """Add the shard's rows (labels: global row numbers) to a copy of the template; write the
    shard file, then its record (with the seconds each of ``SHARD_PHASES`` took). Returns the
    record."""
    store = ctx.open()
    path, record_path = _shard_paths(store, ctx, shard)
    seconds = dict.fromkeys(SHARD_PHASES, 0.0)
    with workdir(store, ctx) as work:
        index = read_template(store, ctx, template_sha256, work)
        row, clock = shard.first_row, time.perf_counter()
        for x in iter_shard_vectors(store, ctx, shard):
            read = time.perf_counter()
            index.add_with_ids(x, np.arange(row, row + len(x), dtype=np.int64))
            row, added = row + len(x), time.perf_counter()
            seconds["read"] += read - clock
            seconds["add"] += added - read
            clock = added
        local = os.path.join(work, f"{shard.name}.faiss")
        faiss.write_index(index, local)
        del index
        record = {
            "shard": shard.number,
            "first_row": shard.first_row,
            "rows": shard.rows,
            "files": list(shard.files),
            "template_sha256": template_sha256,
            **file_record(local),
        }
        put(store, local, path)
        seconds["write"] = time.perf_counter() - clock
    record["seconds"] = {name: round(value, 6) for name, value in seconds.items()}
    store.backend.replace(record_path, json.dumps(record).encode())
    return record


def write_ids(store: GalleryStore, ctx: ShardContext, parquet_path: str, arrow_path: str) -> int:
    """Stream the version's ids, in row order, to Parquet and to an Arrow IPC file; return the
    row count. Batches of ``IDS_BATCH_ROWS`` keep the IPC file's batch index small."""
    rows, writers = 0, []
    batches = store.iter_batches(ctx.gallery, ctx.info.version, IDS_BATCH_ROWS, columns=["id"])
    try:
        for batch in batches:
            if not writers:
                schema = pa.schema([batch.schema.field("id")])
                writers = [
                    pq.ParquetWriter(parquet_path, schema),
                    pa.ipc.new_file(arrow_path, schema),
                ]
            ids = pa.record_batch([batch.column("id")], schema=schema)
            for writer in writers:
                writer.write_batch(ids)
            rows += ids.num_rows
    finally:
        for writer in writers:
            writer.close()
    return rows


def merge_shards(ctx: ShardContext, shards: list[Shard], template_sha256: str) -> dict:
    """Merge the shards into ``index.faiss`` + ``index.ivfdata`` (faiss ``OnDiskInvertedLists``,
    streamed list by list, shards memory-mapped), write the id files, publish them into the
    build folder and return ``{file: {"bytes", "sha256"}}`` for the pointer."""
    from faiss.contrib.ondisk import merge_ondisk

    store = ctx.open()
    with workdir(store, ctx) as work:
        index = read_template(store, ctx, template_sha256, work)
        os.makedirs(os.path.join(work, SHARDS_DIR))
        inputs = [
            local_copy(store, _shard_paths(store, ctx, s)[0], os.path.join(work, SHARDS_DIR))
            for s in shards
        ]
        with stdout_to_stderr():  # faiss prints each resize of the data file
            merge_ondisk(index, inputs, os.path.join(work, "index.ivfdata"))
        if index.ntotal != ctx.info.rows:
            raise CorruptIndexError(
                f"{store.backend.uri(ctx.path(store))}: shards hold {index.ntotal} rows, "
                f"version {ctx.info.version} has {ctx.info.rows}; rerun the build"
            )
        # Record the data file by its bare name, not the scratch path: the header is then the
        # same on every merge (checksums repeat) and the loader finds the file beside it.
        lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists)
        lists.filename = "index.ivfdata"
        faiss.write_index(index, os.path.join(work, "index.faiss"))
        meta = {"distance": ctx.distance, "kind": SHARDED_IVF}
        if quantizer_ef(index) is not None:  # a flat build's file is as it always was
            meta["quantizer"] = "hnsw"
        del index, lists
        shutil.rmtree(os.path.join(work, SHARDS_DIR))
        Path(work, "index.faiss.json").write_text(json.dumps(meta))
        id_rows = write_ids(
            store, ctx, os.path.join(work, "ids.parquet"), os.path.join(work, "ids.arrow")
        )
        if id_rows != ctx.info.rows:  # iter_batches checks it too; this names the build
            raise CorruptIndexError(f"{ctx.path(store)}: wrote {id_rows} ids, not {ctx.info.rows}")
        files = {name: file_record(os.path.join(work, name)) for name in MERGED_FILES}
        for name in MERGED_FILES:
            put(store, os.path.join(work, name), ctx.path(store, name))
    return files
