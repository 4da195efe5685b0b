"""Transformation of a stored gallery version: ``v_new = h(v_old, psi)`` (and ``g`` for psi), for
any kind of ``h`` (:mod:`raycompat.transformations`; FCT's learned ``h`` is one).

    transform_version(store, "faces", "v1", VersionInfo("v2", "resnet50-t2", 128, False,
                      "v2 = h_2(v1)", side_info_width=64), "runs/h2", "runs/g2")

Every check that can fail without touching rows runs first, before any Ray work: the source
version exists, its widths match ``h``/``g``, the target widths match their outputs, and every
input file has a readable footer and the version's schema. Rows are checked as they stream
(NaN/inf, nulls: the error names the input file and row). The new version is published only
when every part is written and ``Staging.commit`` has verified them; on any error nothing is
published and the staging prefix keeps the finished parts for a rerun (``resume.py``).

Throughput (issue 38): the rows cost Parquet decode, checks and encode, not ``h``/``g``, so
``run.pool: auto`` sizes the pool from the cluster (``pool.py``: several actors share each GPU,
each reading and writing its own chunks), and each actor overlaps its steps: batch k+1 is read,
decoded and checked in a thread while batch k is transformed and batch k-1 written. Arrow's
buffers become tensors without a copy; on CUDA they go up from pinned memory and ``h``'s and
``g``'s outputs come back together in one asynchronous copy, with one wait per batch.

Backward-compatible upgrades need no rewrite: :func:`identity_upgrade` checks the gallery
version and returns without writing; the new model is then served against the existing
version (recording that pairing belongs to the model registry, a later issue).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from raycompat.cluster.pipelines.host_copy import HostCopy, copy_to_host
from raycompat.cluster.pipelines.inputs import (
    iter_chunk_batches,
    plan_version_chunks,
)
from raycompat.cluster.pipelines.parts import Chunk, PartWriter
from raycompat.cluster.pipelines.pool import describe_nodes, plan_pool
from raycompat.cluster.pipelines.runner import ChunkWorker, live_nodes, run_staged
from raycompat.cluster.pipelines.weights import Shared, share_transformation, transformation_of
from raycompat.config.pipelines import RunOptions
from raycompat.io.prefetch import prefetch
from raycompat.store import GalleryStore, SchemaError, VersionInfo, embedding_schema
from raycompat.store.commit.part_record import IdFingerprint
from raycompat.store.commit.staging import Staging
from raycompat.store.read.vectors import float32_rows
from raycompat.transformations import (
    G,
    H,
    StoredSpec,
    TransformationFiles,
    read_transformation,
    read_transformation_spec,
)

logger = logging.getLogger(__name__)

# Batches read ahead of the transformation: one queued plus one being read (memory per actor:
# about four batches with the one transformed and the one being written)
PREFETCH_BATCHES = 1


def apply_transformation(table: pa.Table | pa.RecordBatch, h, g=None, autocast=None) -> pa.Table:
    """``(N rows: id, embedding (d_old), [side_info], ...)`` -> ``id, h(...) (d_new), [g(...)]``.

    Columns other than ``embedding``/``side_info`` (``id``, ``label``, ...) are carried along.
    """
    return launch_transformation(table, h, g, autocast).table()


@dataclass
class Launched:
    """A batch whose ``h`` (and ``g``) outputs are computed, or on their way to the host:
    :meth:`table` waits for them (on CUDA the batch's one host sync) and builds its rows."""

    batch: pa.Table | pa.RecordBatch
    outputs: HostCopy  # float32 (N, d): h's, then g's

    def table(self) -> pa.Table:
        columns = {"id": self.batch.column("id")}
        for name, rows in zip(("embedding", "side_info"), self.outputs.wait(), strict=False):
            columns[name] = _fixed(rows.numpy())
        for name in self.batch.column_names:
            if name not in ("id", "embedding", "side_info"):
                columns[name] = self.batch.column(name)
        return pa.table(columns)


def launch_transformation(
    table: pa.Table | pa.RecordBatch,
    h,
    g=None,
    autocast=None,
    rows: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> Launched:
    """Queue ``h`` (and ``g``) on ``table``'s rows on their device without waiting for them.

    ``rows``: ``table``'s :func:`host_rows`, when made already (in the read-ahead thread). On
    CUDA the inputs go up from pinned memory and both outputs come back in one copy into a
    pinned buffer, asynchronously (``host_copy.py``); ``Launched.table()`` waits. On the CPU
    the outputs are the modules' own tensors (no copy): the same numbers as ``h(old, side)``
    computed alone.
    """
    device = h.device
    old, side = rows or host_rows(table, h, g, pin=device.type == "cuda")
    old = old.to(device, non_blocking=True)
    side = side if side is None else side.to(device, non_blocking=True)
    mixed = torch.autocast(device.type, autocast, enabled=autocast is not None)
    with torch.inference_mode(), mixed:
        outputs = [h(old, side if h.d_side else None).float()]
        if g is not None:
            outputs.append(g(old, side if g.d_side else None).float())
    return Launched(table, copy_to_host(outputs))


def host_rows(
    table: pa.Table | pa.RecordBatch, h, g=None, pin: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(embedding (N, d_old), side_info (N, d_side) or None)`` of ``table`` as float32 host
    tensors for ``h`` (and ``g``): views of Arrow's buffers, or copies in pinned memory with
    ``pin`` (for a CUDA device: the copy up then need not wait)."""
    old = _rows(table, "embedding", pin)
    side = None
    if "side_info" in table.column_names and h.d_side + (g.d_side if g else 0) > 0:
        side = _rows(table, "side_info", pin)
    return old, side


def _rows(table: pa.Table | pa.RecordBatch, name: str, pin: bool = False) -> torch.Tensor:
    """A vector column as an ``(N, d)`` float32 tensor: a view of Arrow's buffer for float32,
    not a copy (``pin``: a copy in pinned memory). Read-only memory is safe here: h and g
    never write to their inputs (their first layer is a Linear), and inference mode records no
    autograd."""
    column = table.column(name)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    with warnings.catch_warnings():  # torch warns once about a non-writable array
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        rows = torch.from_numpy(float32_rows(column, copy=False))
    return rows.pin_memory() if pin else rows


def _fixed(x: np.ndarray) -> pa.FixedSizeListArray:
    """``(N, d)`` -> ``fixed_size_list<float32>[d]`` over the same memory (no copy)."""
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


class TransformChunks(ChunkWorker):
    """Actor: builds ``h`` (and ``g``) once from the object store (``weights.py``: never from
    a folder, which may exist only on the driver's node), then streams each chunk of the
    source through them: batch k+1 is read, decoded and checked in a thread (``prefetch.py``)
    while batch k is transformed (queued, on a GPU) and batch k-1 written."""

    def __init__(
        self,
        *,
        transformation: Shared | str,
        side_info_transformation: Shared | str | None,
        source: VersionInfo,
        **base,
    ) -> None:
        super().__init__(**base)
        self.source = source
        self.h = transformation_of(transformation, H).to(self.device)
        g = side_info_transformation
        self.g = transformation_of(g, G).to(self.device) if g else None

    def fill(self, chunk: Chunk, writer: PartWriter) -> None:
        previous = None
        with closing(prefetch(self.read(chunk), depth=PREFETCH_BATCHES)) as ready:
            for batch, rows in ready:
                writer.read(batch.column("id"))
                launched = launch_transformation(batch, self.h, self.g, self.autocast, rows)
                if previous is not None:
                    writer.write(previous.table())
                previous = launched
        if previous is not None:
            writer.write(previous.table())

    def read(self, chunk: Chunk) -> Iterator[tuple[pa.RecordBatch, tuple]]:
        """``(batch, host_rows)`` of each checked batch of ``chunk`` (in the read-ahead thread:
        on CUDA the copy into pinned memory happens there too)."""
        pin = self.device.type == "cuda"
        batches = iter_chunk_batches(self.store, chunk, self.source, self.run.batch_size)
        with closing(batches):
            for batch in batches:
                yield batch, host_rows(batch, self.h, self.g, pin)


def _spec(transformation: TransformationFiles | str, name: str) -> tuple[str, StoredSpec]:
    """``(where, spec)`` of ``h``/``g`` read already, or of the folder holding it."""
    if isinstance(transformation, TransformationFiles):
        return transformation.location, transformation.spec
    return transformation, read_transformation_spec(transformation, name)


def check_transformation(
    source: VersionInfo,
    target: VersionInfo,
    h_files: TransformationFiles | str,
    g_files: TransformationFiles | str | None,
) -> None:
    """Widths of source, ``h``, ``g`` and target agree; raises ``SchemaError`` naming both.
    ``h_files``/``g_files``: read by :func:`read_transformation`, or their folders."""
    h_dir, h = _spec(h_files, H)
    expect = [
        (f"source {source.version} width", source.width, f"{h_dir} d_old", h.d_old),
        (f"target {target.version} width", target.width, f"{h_dir} d_new", h.d_new),
    ]
    if h.d_side:
        expect.append(
            (
                f"source {source.version} side_info_width",
                source.side_info_width,
                f"{h_dir} d_side",
                h.d_side,
            )
        )
    if target.normalized and not h.normalize_output:
        raise SchemaError(
            f"target {target.version} is normalized but {h_dir} does not "
            f"normalise its output (normalize_output=false)"
        )
    if g_files is not None:
        g_dir, g = _spec(g_files, G)
        expect.append((f"source {source.version} width", source.width, f"{g_dir} d_old", g.d_old))
        expect.append(
            (
                f"source {source.version} side_info_width",
                source.side_info_width,
                f"{g_dir} d_side",
                g.d_side or None,
            )
        )
        expect.append(
            (
                f"target {target.version} side_info_width",
                target.side_info_width,
                f"{g_dir} d_new",
                g.d_new,
            )
        )
    elif target.side_info_width is not None:
        raise SchemaError(
            f"target {target.version} declares side_info_width="
            f"{target.side_info_width} but no side-info transformation g is given"
        )
    for left, a, right, b in expect:
        if a != b:
            raise SchemaError(f"{left} is {a} but {right} is {b}")


def transform_version(
    store: GalleryStore,
    gallery: str,
    source_version: str,
    target: VersionInfo,
    transformation: str,
    side_info_transformation: str | None = None,
    run: RunOptions | None = None,
    staging_name: str | None = None,
    verify: Callable[[Staging], None] | None = None,
) -> dict:
    """Write ``target`` = h(``source_version``) as a new published version; resumable.

    Args:
        transformation / side_info_transformation: folders or ``s3://`` URIs holding what
            ``save_transformation`` wrote (h, and g for side info or None); read once here and
            shipped to the actors through Ray's object store (``weights.py``).
        staging_name: fixed per job so that a rerun resumes (default ``transform-<source>``).
        verify: called with the staging area once every part is written, before publishing;
            an exception it raises leaves the version unpublished (the parts stay, resumable).
    Returns:
        progress summary (rows, rows/s, seconds) plus ``"version"``: the published record.
    """
    run = run or RunOptions()
    source = store.version(gallery, source_version)  # ManifestError if absent
    h = read_transformation(transformation, H, _options(store, transformation))
    g = side_info_transformation
    g = g and read_transformation(g, G, _options(store, g))
    check_transformation(source, target, h, g)
    chunks, id_type, carried = plan_version_chunks(store, gallery, source, run.rows_per_file)
    run = sized_pool(run, len(chunks))
    schema = embedding_schema(target.width, id_type, target.side_info_width, dtype=target.dtype)
    schema = pa.schema(list(schema) + carried)
    staging = store.begin(gallery, target, staging_name or f"transform-{source_version}")
    identity = {
        "kind": "transform",
        "source": f"{gallery}/{source.version}@{source.created}",
        "h": h.digest,
        "g": g.digest if g else None,
        "rows_per_file": run.rows_per_file,
    }
    return run_staged(
        store,
        gallery,
        staging,
        name=f"transform {gallery}/{source_version} -> {target.version}",
        identity=identity,
        chunks=chunks,
        worker=TransformChunks,
        worker_kwargs=dict(
            transformation=share_transformation(h),
            side_info_transformation=g and share_transformation(g),
            source=source,
        ),
        schema=schema,
        run=run,
        verify=verify,
        # O(parts): each part holds exactly its input chunk's ids, and together they hold the
        # source's. Sources published before versions carried fingerprints are read instead.
        check="records" if source.ids else "rows",
        expected_ids=IdFingerprint.from_dict(source.ids) if source.ids else None,
    )


def sized_pool(run: RunOptions, chunks: int) -> RunOptions:
    """``run`` with ``actors`` and ``num_gpus_per_actor`` sized from the cluster's live nodes
    when ``run.pool`` is ``"auto"`` (``pool.py``; the sizes are logged), else ``run``."""
    if run.pool != "auto":
        return run
    nodes = live_nodes()
    sized = plan_pool(run, nodes, chunks)
    logger.info(
        "transform pool from %s: %d actor(s) x %d CPU x %s GPU",
        describe_nodes(nodes, chunks),
        sized.actors,
        sized.threads_per_actor,
        sized.num_gpus_per_actor,
    )
    return sized


def _options(store: GalleryStore, location) -> dict | None:
    """The store's credentials for an ``s3://`` ``h``/``g``; none for a local folder."""
    return store.storage_options if "://" in str(location) else None


@dataclass
class IdentityUpgrade:
    """A backward-compatible upgrade: ``model_version`` reads ``gallery/version`` as it is."""

    gallery: str
    version: str
    model_version: str
    rows: int


def identity_upgrade(
    store: GalleryStore, gallery: str, version: str, model_version: str
) -> IdentityUpgrade:
    """The no-rewrite path: check the version exists and return; nothing is written.

    A backward-compatible model (BCT, CoReS, d-Simplex...) embeds queries comparably to the
    existing gallery, so the gallery is not transformed. Registering the pairing
    (model -> gallery version) is the model registry's job (a later issue).
    """
    info = store.version(gallery, version)
    logger.info(
        "identity upgrade: %s serves %s/%s (%d rows) without a rewrite",
        model_version,
        gallery,
        version,
        info.rows,
    )
    return IdentityUpgrade(gallery, version, model_version, info.rows)
