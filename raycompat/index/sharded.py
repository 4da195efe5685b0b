"""A large version's index, built in shards by parallel tasks, searched from disk.

    build_version_index(store, "faces", "v3")                  # kind="auto": this above 100k rows
    from raycompat.cluster.pipelines.index import RayTasks             # the Ray layer's runner
    build_version_index(store, "faces", "v3", kind="sharded_ivf", runner=RayTasks(workers=8))

The index (``kind="sharded_ivf"``) is an IVF-Flat: a coarse quantizer of ``nlist`` centroids and
one inverted list of full vectors per centroid, labelled with their row numbers in the version.
The coarse quantizer (``quantizer=``, :func:`raycompat.index.ivf.ivf_quantizer`) is exact
(``"flat"``: assigning a row costs ``nlist d``) below ``HNSW_MIN_NLIST`` = 16384 lists and, from
there (``"auto"``), an HNSW graph (M = 32) over the same k-means centroids: faiss'
``IVF{nlist}_HNSW32`` of the wiki's "Indexing 1G vectors", whose cost per row grows as
``log nlist``. Rows are added with the graph's efSearch at ``HNSW_EF_ADD`` = 8 (faiss' default
is 16; 8 adds in about 0.56x the time, ivf.py says at what recall). ``HNSW_MIN_NLIST`` is
where adding a row through the graph got clearly cheaper than flat on this machine (1 thread,
d = 32: benchmarks/ivf_quantizer.py; at 8192 lists it is a wash); a search raises the graph's
efSearch to ``nprobe`` (it must find ``nprobe`` lists; with fewer, recall drops). ``"flat"`` or
``"hnsw"`` forces one. The template's record, the pointer and ``index.faiss.json`` name an HNSW
quantizer, and the build's identity its M and efSearch when adding (a build made with others
is another folder); a flat build's files, identity and folder name are as before, and both load
and merge (``merge_ondisk``) alike.

1. **Plan** (driver, O(parts), :func:`plan_build` -> :class:`BuildPlan`, nothing written): the
   part files' footers give their rows; consecutive parts are grouped into shards. Without
   ``rows_per_shard``, :func:`default_shards`: enough that none holds more than 256 MiB of
   vectors (``SHARD_BYTES / (4 d + 8)`` rows), at least one per worker of the runner
   (``runner.workers``), rounded up to whole waves of workers, each about ``N / shards`` rows;
   with it, shards of at least ``rows_per_shard`` rows. Shards never split a part file.
2. **Train** (tasks): a seeded sample of rows is read by one task per shard into the build
   folder (``_sample/``), and one task trains the quantizer on it with faiss' k-means, on the
   GPU when the runner has one (it reserves it; faiss uses it when it sees it there), else on a
   whole node's CPUs (``runner.node_cpus()``, reserved, and as many faiss OpenMP threads; the
   add tasks keep their per-worker share); the sample files are removed once the template is
   saved.
   ``nlist = raycompat.index.ivf.ivf_nlist(N)``: the next power of two of ``4 sqrt(N)``, at most
   65536 and at most ``N / 39`` (faiss wants at least 39 training points per centroid), at
   least 1. The sample is ``64 nlist`` rows (``train_size`` overrides), at most N. The
   trained, empty index is saved as the template.
3. **Add** (tasks, one per shard, progress logged): each task adds its rows to a copy of the
   template and writes one shard file plus its record (rows, first row, template sha256, bytes,
   sha256, and the seconds it spent reading, adding and writing: the driver logs their sums).
4. **Merge** (one task): ``faiss.contrib.ondisk.merge_ondisk`` streams the shards' lists
   (memory-mapped) into one ``OnDiskInvertedLists`` file, ``index.ivfdata``; ``index.faiss`` is
   the quantizer plus the lists' offsets. The task also writes the gallery ids in row order
   (``ids.parquet``, and ``ids.arrow`` for memory-mapped lookups, :mod:`mapped_ids`).
5. **Publish** (driver): the pointer names the build and records every file's size and sha256.

Steps 2-4 run as task functions (:mod:`raycompat.index.shard_tasks`) through a
:class:`~raycompat.index.tasks.TaskRunner`: :class:`LocalTasks` in this process, or the Ray
layer's ``RayTasks``. The driver holds the plan and O(shards) records; never a vector nor an id.

The build folder's name is a digest of the version and the parameters, so a rerun (or
``open_version_index(rebuild=True)`` after a corrupt load) continues the same build: the
template and every shard whose file matches its record are kept, missing or corrupt shards are
redone, and the merge is redone. Merged files replace the old ones by rename, so a reader that
has them memory-mapped is not disturbed. Shards are kept (twice the disk) so that such a rerun
is cheap; ``keep_shards=False`` deletes them after publishing.

**Search.** ``nprobe`` defaults to ``raycompat.index.ivf.ivf_nprobe(nlist)``: ``next_pow2(sqrt
nlist)``, between 16 and ``nlist``; ``VersionIndex.search(..., nprobe=)`` and ``raycompat search
--nprobe`` override it. The loader opens ``index.faiss`` with ``IO_FLAG_ONDISK_SAME_DIR``: the
lists stay in the memory-mapped ``index.ivfdata`` (the page cache holds what queries touch), and
ids are looked up in the memory-mapped ``ids.arrow`` (faiss's note of where it found the lists
goes to stderr: :func:`raycompat.index.stdout.stdout_to_stderr`). A local store is opened in place;
an S3
store's files are copied to a local folder that lives as long as the loaded index. The index
stays on the CPU unless ``use_gpu=True`` (a GPU copy would hold every list in GPU memory).
faiss's ``OnDiskInvertedLists`` starts ``prefetch_nthread`` (32) read-ahead threads on every
search call, which cost 1.4-2.2 ms against a 0.2 ms single query (issue 24); the loader sets it
to 0 (:func:`no_read_ahead`): the page cache and the kernel's read-ahead of the memory map serve
the lists, and a batch is already spread over faiss's OpenMP threads, each faulting its own
lists in (benchmarks/search_latency.py).

**Verification on load.** Every file's size is checked against the pointer. The small files
(``index.faiss``, ``index.faiss.json``) are also hashed; the data files (``index.ivfdata``,
``ids.arrow``, ``ids.parquet``: O(N) bytes) are hashed only with ``verify="full"``, since hashing
gigabytes at every load would cost more than the search. A truncated or missing data file is
always caught; a same-size bit flip in one is caught by ``verify="full"`` (run it after copying
a build, or periodically).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow.fs as pafs

from raycompat.errors import CorruptIndexError, StoreError
from raycompat.index.distances import Distance, get_distance
from raycompat.index.gpu import check_use_gpu
from raycompat.index.ivf import SHARDED_IVF, hnsw_params, ivf_nlist, ivf_nprobe, ivf_quantizer
from raycompat.index.mapped_ids import MappedIds
from raycompat.index.search_index import SearchIndex
from raycompat.index.shard_tasks import (
    MERGED_FILES,
    SAMPLE_DIR,
    SHARD_PHASES,
    SHARDS_DIR,
    TEMPLATE,
    Shard,
    ShardContext,
    Training,
    build_shard,
    file_record,
    local_copy,
    merge_shards,
    store_sha256,
    train_template,
    verify_shard,
    version_paths,
    write_sample,
)
from raycompat.index.stdout import stdout_to_stderr
from raycompat.index.tasks import LocalTasks, TaskRunner
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import VersionInfo

logger = logging.getLogger(__name__)
SHARD_BYTES = 256 << 20
TRAIN_PER_LIST = 64
PLAN_FILE, TEMPLATE_RECORD = "_build.json", "_template.json"
HASHED_ON_LOAD = ("index.faiss", "index.faiss.json")
NEEDED_ON_LOAD = ("index.faiss", "index.faiss.json", "index.ivfdata", "ids.arrow")
VERIFY_MODES = ("auto", "full")


def plan_shards(
    store: GalleryStore,
    gallery: str,
    info: VersionInfo,
    rows_per_shard: int | None = None,
    shards: int | None = None,
) -> list[Shard]:
    """Group the version's part files, in order, into shards (never splitting a file; rows
    counted from the footers): of at least ``rows_per_shard`` rows (the last may be smaller),
    or else ``shards`` of about ``N / shards`` rows, a shard ending at the first file that
    reaches its share (fewer when there are fewer files)."""

    def full(done: int, rows: int, made: int) -> bool:
        if rows_per_shard is not None:
            return rows >= rows_per_shard
        return (done + rows) * shards >= (made + 1) * info.rows

    out, files, counts, first = [], [], [], 0
    for k, (rel, (path, source)) in enumerate(version_paths(store, gallery, info).items()):
        with store.open_file(info, path, source) as f:
            files.append(rel)
            counts.append(f.metadata.num_rows)
        if full(first, sum(counts), len(out)) or k == len(info.files) - 1:
            out.append(Shard(len(out), first, tuple(files), tuple(counts)))
            first += sum(counts)
            files, counts = [], []
    if first != info.rows:
        raise StoreError(
            f"{store.uri(gallery)}: version {info.version} record says {info.rows} rows, its "
            f"files hold {first}"
        )
    return out


def default_shards(rows: int, width: int, workers: int) -> int:
    """Shards of a build without ``rows_per_shard``: enough that none holds more than
    ``SHARD_BYTES`` of vectors, at least one per worker, and a multiple of ``workers`` (no
    worker waits through a last, lone wave), at most one per row."""
    by_size = -(-rows // max(1, SHARD_BYTES // (4 * width + 8)))
    waves = -(-max(workers, by_size) // workers)
    return max(1, min(rows, waves * workers))


def sample_rows(rows: int, size: int, seed: int) -> np.ndarray:
    """``size`` distinct sorted row numbers out of ``rows``, seeded; O(size) memory (NumPy's
    ``choice`` without replacement permutes all ``rows`` when ``size > rows / 50``)."""
    rng = np.random.default_rng(seed)
    if size >= rows:
        return np.arange(rows, dtype=np.int64)
    if 2 * size > rows:
        return np.sort(rng.permutation(rows)[:size])
    pool = np.unique(rng.integers(0, rows, size=size + size // 4 + 16))
    while len(pool) < size:
        pool = np.union1d(pool, rng.integers(0, rows, size=size))
    return np.sort(rng.choice(pool, size=size, replace=False))


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _read_json(store: GalleryStore, path: str) -> dict | None:
    try:
        return json.loads(store.backend.read(path))
    except FileNotFoundError:
        return None
    except ValueError:
        return {}  # unreadable: treated as different, so it is rewritten


def _record_plan(store: GalleryStore, ctx: ShardContext, identity: dict, shards: list[Shard]):
    path = ctx.path(store, PLAN_FILE)
    plan = {"identity": identity, "shards": [asdict(s) for s in shards]}
    plan = json.loads(json.dumps(plan))  # tuples as lists, as read back
    stored = _read_json(store, path)
    if stored is not None and stored != plan:
        raise StoreError(
            f"{store.backend.uri(path)}: build {ctx.build} was planned with other parameters "
            f"or another version; use another build name"
        )
    if stored is None:
        store.backend.replace(path, json.dumps(plan).encode())


def _remove_scratch(store: GalleryStore, ctx: ShardContext) -> None:
    """Scratch folders that killed tasks left in the build folder (local stores only; one
    build of a folder runs at a time)."""
    for entry in store.filesystem.get_file_info(pafs.FileSelector(ctx.path(store))):
        if entry.type == pafs.FileType.Directory and entry.base_name.startswith("_work-"):
            logger.info("removing %s, left by a killed index task", entry.path)
            store.filesystem.delete_dir(entry.path)


def _remove_sample(store: GalleryStore, ctx: ShardContext) -> None:
    """The training sample's files, once the template they trained is recorded."""
    folder = ctx.path(store, SAMPLE_DIR)
    if store.filesystem.get_file_info(folder).type != pafs.FileType.NotFound:
        store.filesystem.delete_dir(folder)


def _training_gpus(runner: TaskRunner, use_gpu: bool | str) -> int:
    """GPUs the k-means task asks for: 1 when the runner has one and ``use_gpu`` allows it."""
    check_use_gpu(use_gpu)
    available = runner.gpus_available() if use_gpu else 0
    if use_gpu is True and not available:
        raise RuntimeError("use_gpu=True but the index runner has no GPU (faiss or Ray sees none)")
    return 1 if available else 0


def training_resources(runner: TaskRunner, use_gpu: bool | str) -> tuple[int, int | None]:
    """``(gpus, cpus)`` the k-means task reserves: one GPU (and the task's CPU share: None)
    when the runner has one and ``use_gpu`` allows it, else a whole node's CPUs
    (``runner.node_cpus()``; None for a runner without that method: its share)."""
    gpus = _training_gpus(runner, use_gpu)
    node_cpus = getattr(runner, "node_cpus", None)
    return gpus, (None if gpus or node_cpus is None else node_cpus())


@dataclass(frozen=True)
class BuildPlan:
    """A sharded build of ``ctx.info``, decided on the driver before any task runs.

    Attributes:
        ctx: what every task needs (store, version, build folder name, distance, batch rows).
        shards: consecutive part files grouped by :func:`plan_shards`.
        identity: the version and parameters; ``_build.json`` records them with the shards,
            and their digest names the default build folder.
        nlist / nprobe / train_rows / seed: the IVF's lists, default probes, k-means sample.
        quantizer: ``"flat"`` or ``"hnsw"`` (:func:`raycompat.index.ivf.ivf_quantizer`).
    """

    ctx: ShardContext
    shards: list[Shard]
    identity: dict
    nlist: int
    nprobe: int
    train_rows: int
    seed: int
    quantizer: str = "flat"

    def pointer(self, files: dict) -> dict:
        """The pointer to publish, given the merged ``files``' records."""
        return {
            "build": self.ctx.build,
            "kind": SHARDED_IVF,
            "distance": self.ctx.distance,
            "rows": self.ctx.info.rows,
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "quantizer": self.quantizer,
            "shards": len(self.shards),
            "files": files,
        }


def plan_build(
    store: GalleryStore,
    gallery: str,
    info: VersionInfo,
    dist: Distance,
    *,
    threads: int | None = None,
    nlist: int | None = None,
    nprobe: int | None = None,
    train_size: int | None = None,
    rows_per_shard: int | None = None,
    batch_size: int = 65536,
    seed: int = 0,
    build: str | None = None,
    workers: int = 1,
    quantizer: str = "auto",
) -> BuildPlan:
    """The sizes (module docstring: ``nlist``, ``nprobe``, the sample, the quantizer), the
    shards (from the part files' footers; without ``rows_per_shard``, :func:`default_shards`
    for ``workers`` tasks at a time) and the build folder's name; nothing is written.
    Raises ``ValueError`` for an ``nlist`` out of range or an unknown ``quantizer``.

    Args:
        threads: faiss threads per task (the runner's).
        nlist / nprobe / train_size: default ``ivf_nlist(N)``, ``ivf_nprobe(nlist)``,
            ``64 nlist`` sampled rows (module docstring).
        rows_per_shard: rows added by one task (default: :func:`default_shards` shards, at
            least one per worker of the runner, at most ``SHARD_BYTES`` of vectors each).
        quantizer: the coarse quantizer, ``"flat"``, ``"hnsw"`` or ``"auto"`` (HNSW from
            ``HNSW_MIN_NLIST`` lists on; module docstring).
        build: the build folder's name (default: a digest of the version and the parameters,
            so that a rerun resumes).
    """
    nlist = int(nlist or ivf_nlist(info.rows))
    train_rows = min(info.rows, int(train_size or TRAIN_PER_LIST * nlist))
    if not 1 <= nlist <= train_rows:
        raise ValueError(f"{SHARDED_IVF}: nlist={nlist} must be in [1, {train_rows}] (train rows)")
    nprobe = int(nprobe or ivf_nprobe(nlist))
    quantizer = ivf_quantizer(nlist, quantizer)
    if rows_per_shard:
        shards = plan_shards(store, gallery, info, rows_per_shard=rows_per_shard)
    else:
        count = default_shards(info.rows, info.width, workers)
        shards = plan_shards(store, gallery, info, shards=count)
    identity = {
        "kind": SHARDED_IVF,
        "version": info.version,
        "created": info.created,
        "rows": info.rows,
        "distance": dist.name,
        "nlist": nlist,
        "nprobe": nprobe,
        "train_rows": train_rows,
        "seed": seed,
        "faiss": faiss.__version__,
    }
    if quantizer != "flat":  # a flat build keeps the folder name it always had
        identity["quantizer"] = quantizer
        identity["hnsw"] = hnsw_params()  # earlier builds had others
    build = build or f"{SHARDED_IVF}-{_digest([identity, [asdict(s) for s in shards]])[:16]}"
    ctx = ShardContext(
        store.root, store.storage_options, gallery, info, build, dist.name, batch_size, threads
    )
    return BuildPlan(ctx, shards, identity, nlist, nprobe, train_rows, seed, quantizer)


def _template(store: GalleryStore, plan: BuildPlan, runner: TaskRunner, use_gpu: bool | str) -> str:
    """The sha256 of the build's trained template: the stored one if it is intact, otherwise
    trained now on a seeded sample (read by one task per shard) and saved."""
    ctx = plan.ctx
    path, record_path = ctx.path(store, TEMPLATE), ctx.path(store, TEMPLATE_RECORD)
    record = _read_json(store, record_path)
    if record and store.filesystem.get_file_info(path).size == record.get("bytes"):
        if store_sha256(store, path) == record.get("sha256"):
            _remove_sample(store, ctx)  # a run killed between the record and the clean-up
            return record["sha256"]
    rows = sample_rows(ctx.info.rows, plan.train_rows, plan.seed)
    calls = []
    for shard in plan.shards:
        mine = rows[(rows >= shard.first_row) & (rows < shard.first_row + shard.rows)]
        if len(mine):
            calls.append((ctx, shard, mine))
    gpus, cpus = training_resources(runner, use_gpu)
    samples = runner.map(write_sample, calls, name="index training sample")
    training = Training(
        plan.nlist, plan.nprobe, plan.seed, use_gpu if gpus else False, plan.quantizer, cpus
    )
    [record] = runner.map(
        train_template, [(ctx, samples, training)], name="index training", gpus=gpus, cpus=cpus
    )
    store.backend.replace(record_path, json.dumps(record).encode())
    _remove_sample(store, ctx)
    logger.info(
        "trained %d lists (%s quantizer) on %d sampled rows with %s CPUs",
        plan.nlist,
        plan.quantizer,
        record["train_rows"],
        cpus or "the task's",
    )
    return record["sha256"]


def _shards_to_build(
    store: GalleryStore, plan: BuildPlan, runner: TaskRunner, template: str
) -> list[Shard]:
    """The shards without a record, or whose file fails its record (checked by tasks, each
    logged with why): what a rerun of the build redoes (their count is logged)."""
    ctx = plan.ctx
    listing = pafs.FileSelector(ctx.path(store, SHARDS_DIR), allow_not_found=True)
    recorded = {
        Path(e.path).stem
        for e in store.filesystem.get_file_info(listing)
        if e.path.endswith(".json")
    }
    checked = [s for s in plan.shards if s.name in recorded]
    problems = runner.map(
        verify_shard, [(ctx, s, template) for s in checked], name="index shard check"
    )
    bad = {s.name for s, why in zip(checked, problems, strict=True) if why is not None}
    for s, why in zip(checked, problems, strict=True):
        if why is not None:
            logger.warning("index shard %s is redone: %s", s.name, why)
    todo = [s for s in plan.shards if s.name not in recorded or s.name in bad]
    logger.info(
        "%s/%s: %d shards, %d to build (%d rows from an earlier run)",
        ctx.gallery,
        ctx.info.version,
        len(plan.shards),
        len(todo),
        ctx.info.rows - sum(s.rows for s in todo),
    )
    return todo


def _log_add_phases(ctx: ShardContext, records: list[dict]) -> None:
    """Log where the add tasks' time went (their records' seconds per phase, summed): what an
    operator compares when a build is slower than expected."""
    rows = sum(r["rows"] for r in records)
    if not rows:
        return
    spent = {p: sum(r["seconds"][p] for r in records) for p in SHARD_PHASES}
    logger.info(
        "%s/%s: the add tasks (%d shard%s) spent %s (us per row)",
        ctx.gallery,
        ctx.info.version,
        len(records),
        "" if len(records) == 1 else "s",
        ", ".join(f"{p} {s:.1f} s ({1e6 * s / rows:.2f})" for p, s in spent.items()),
    )


def build_sharded_index(
    store: GalleryStore,
    gallery: str,
    info: VersionInfo,
    dist: Distance,
    *,
    runner: TaskRunner | None = None,
    use_gpu: bool | str = "auto",
    keep_shards: bool = True,
    **sizes: Any,
) -> dict:
    """Build (or resume) the sharded IVF index of ``info``; return the pointer to publish.

    Args:
        runner: a :class:`TaskRunner` that runs the tasks: :class:`LocalTasks` (default) or the
            Ray layer's ``RayTasks``.
        sizes: :func:`plan_build`'s keywords (``nlist``, ``nprobe``, ``train_size``,
            ``rows_per_shard``, ``batch_size``, ``seed``, ``build``, ``quantizer``); the runner
            gives its ``threads`` and ``workers``.
    """
    runner = runner or LocalTasks()
    threads, workers = getattr(runner, "threads", None), getattr(runner, "workers", 1)
    plan = plan_build(store, gallery, info, dist, threads=threads, workers=workers, **sizes)
    ctx = plan.ctx
    _record_plan(store, ctx, plan.identity, plan.shards)
    _remove_scratch(store, ctx)
    template = _template(store, plan, runner, use_gpu)
    todo = _shards_to_build(store, plan, runner, template)
    skipped = info.rows - sum(s.rows for s in todo)
    records = runner.map(
        build_shard,
        [(ctx, s, template) for s in todo],
        name=f"index {gallery}/{info.version} add",
        rows=[s.rows for s in todo],
        skipped=skipped,
    )
    _log_add_phases(ctx, records)
    [files] = runner.map(merge_shards, [(ctx, plan.shards, template)], name="index merge")
    if not keep_shards:
        store.filesystem.delete_dir(ctx.path(store, SHARDS_DIR))
    return plan.pointer(files)


def _check_merged_files(
    store: GalleryStore, prefix: str, pointer: dict, folder: str, verify: str
) -> None:
    """Every merged file has the pointer's size; the small ones (all with ``verify="full"``)
    its sha256. From a remote store the files the loader opens are copied into ``folder``."""
    remote = store.backend.scheme != "file"
    for name in MERGED_FILES:
        expected, path = pointer["files"][name], f"{prefix}/{name}"
        uri = store.backend.uri(path)
        size = store.filesystem.get_file_info(path).size
        if size is None:
            raise CorruptIndexError(
                f"{uri}: missing, though the pointer names build {pointer['build']}; "
                f"rebuild the index"
            )
        if size != expected["bytes"]:
            raise CorruptIndexError(
                f"{uri}: expected {expected['bytes']} bytes, found {size} (truncated or "
                f"overwritten); rebuild the index"
            )
        copied = remote and name in NEEDED_ON_LOAD
        if copied:
            local_copy(store, path, folder)
        if name in HASHED_ON_LOAD or verify == "full":
            found = (
                file_record(os.path.join(folder, name))["sha256"]
                if copied
                else store_sha256(store, path)
            )
            if found != expected["sha256"]:
                raise CorruptIndexError(
                    f"{uri}: expected sha256 {expected['sha256']}, found {found}; rebuild the index"
                )


def load_sharded_index(
    store: GalleryStore, prefix: str, pointer: dict, *, verify: str = "auto", use_gpu=False
) -> tuple[SearchIndex, MappedIds, tempfile.TemporaryDirectory | None]:
    """Open a published sharded build: ``(index over the memory-mapped lists, ids, the local
    copy's folder or None)``. The folder (S3 stores) must outlive the index.

    Raises:
        CorruptIndexError: a file is missing, of the wrong size, fails its sha256 (small files
            always, data files with ``verify="full"``), or cannot be parsed.
    """
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    remote = store.backend.scheme != "file"
    copy = tempfile.TemporaryDirectory(prefix="raycompat-index-") if remote else None
    folder = copy.name if copy else prefix
    _check_merged_files(store, prefix, pointer, folder, verify)
    try:
        meta = json.loads(Path(folder, "index.faiss.json").read_text())
        flags = faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY
        with stdout_to_stderr():  # faiss prints where it finds index.ivfdata
            raw = faiss.read_index(os.path.join(folder, "index.faiss"), flags)
        index = SearchIndex(raw, get_distance(meta["distance"]), meta["kind"])
        ids = MappedIds(os.path.join(folder, "ids.arrow"))
    except (RuntimeError, ValueError, KeyError, OSError) as error:
        raise CorruptIndexError(
            f"{store.backend.uri(prefix)}: faiss or Arrow cannot read the build ({error}); "
            f"rebuild the index"
        ) from None
    no_read_ahead(raw)
    if use_gpu is True:
        index.place(True)
    return index, ids, copy


def no_read_ahead(index: faiss.Index) -> None:
    """Turn off the read-ahead threads of ``index``'s on-disk inverted lists, if it has any
    (module docstring, "Search")."""
    lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists)
    if isinstance(lists, faiss.OnDiskInvertedLists):
        lists.prefetch_nthread = 0
