"""FCT transformation of a stored gallery version: ``v_new = h(v_old, psi)`` (and ``g`` for psi).

    transform_version(store, "faces", "v1", VersionInfo("v2", "resnet50-t2", 128, False,
                      "v2 = h_2(v1)", side_info_width=64), "runs/h2", "runs/g2")

Every check that can fail without touching rows runs first, before any Ray work: the source
version exists, its widths match ``h``/``g``, the target widths match their outputs, and every
input file has a readable footer and the version's schema. Rows are checked as they stream
(NaN/inf, nulls: the error names the input file and row). The new version is published only
when every part is written and ``Staging.commit`` has verified them; on any error nothing is
published and the staging prefix keeps the finished parts for a rerun (``resume.py``).

Backward-compatible upgrades need no rewrite: :func:`identity_upgrade` checks the gallery
version and returns without writing; the new model is then served against the existing
version (recording that pairing belongs to the model registry, a later issue).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from raycompat.cluster.pipelines.inputs import (
    iter_chunk_batches,
    plan_version_chunks,
)
from raycompat.cluster.pipelines.parts import Chunk, PartWriter
from raycompat.cluster.pipelines.runner import ChunkWorker, RunOptions, run_staged
from raycompat.cluster.pipelines.weights import Shared, share_transformation, transformation_of
from raycompat.fct.models import (
    G,
    H,
    TransformationFiles,
    read_transformation,
    read_transformation_spec,
)
from raycompat.store import GalleryStore, SchemaError, VersionInfo, embedding_schema
from raycompat.store.part_record import IdFingerprint
from raycompat.store.staging import Staging
from raycompat.store.vectors import float32_rows

logger = logging.getLogger(__name__)


def apply_transformation(table: pa.Table | pa.RecordBatch, h, g=None, autocast=None) -> pa.Table:
    """``(N rows: id, embedding (d_old), [side_info], ...)`` -> ``id, h(...) (d_new), [g(...)]``.

    Columns other than ``embedding``/``side_info`` (``id``, ``label``, ...) are carried along.
    """
    device = next(h.parameters()).device
    old = _rows(table, "embedding", device)
    side = None
    if "side_info" in table.column_names and h.d_side + (g.d_side if g else 0) > 0:
        side = _rows(table, "side_info", device)
    mixed = torch.autocast(device.type, autocast, enabled=autocast is not None)
    with torch.inference_mode(), mixed:
        new = h(old, side if h.d_side else None).float().cpu().numpy()
        new_side = g(old, side if g.d_side else None).float().cpu().numpy() if g else None
    columns = {"id": table.column("id"), "embedding": _fixed(new)}
    if new_side is not None:
        columns["side_info"] = _fixed(new_side)
    for name in table.column_names:
        if name not in ("id", "embedding", "side_info"):
            columns[name] = table.column(name)
    return pa.table(columns)


def _rows(table: pa.Table | pa.RecordBatch, name: str, device: torch.device) -> torch.Tensor:
    """A vector column as an ``(N, d)`` float32 tensor on ``device``: a view of Arrow's buffer
    for float32 on the CPU, not a copy. Read-only memory is safe here: h and g never write to
    their inputs (their first layer is a Linear), and inference mode records no autograd."""
    column = table.column(name)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    with warnings.catch_warnings():  # torch warns once about a non-writable array
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(float32_rows(column, copy=False)).to(device)


def _fixed(x: np.ndarray) -> pa.FixedSizeListArray:
    """``(N, d)`` -> ``fixed_size_list<float32>[d]`` over the same memory (no copy)."""
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


class TransformChunks(ChunkWorker):
    """Actor: builds ``h`` (and ``g``) once from the object store (``weights.py``: never from
    a folder, which may exist only on the driver's node), then streams each chunk of the
    source through them."""

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
        for batch in iter_chunk_batches(self.store, chunk, self.source, self.run.batch_size):
            writer.read(batch.column("id"))
            writer.write(apply_transformation(batch, self.h, self.g, self.autocast))


def _spec(transformation: TransformationFiles | str, name: str) -> tuple[str, dict]:
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
        (f"source {source.version} width", source.width, f"{h_dir} d_old", h["d_old"]),
        (f"target {target.version} width", target.width, f"{h_dir} d_new", h["d_new"]),
    ]
    if h["d_side"]:
        expect.append(
            (
                f"source {source.version} side_info_width",
                source.side_info_width,
                f"{h_dir} d_side",
                h["d_side"],
            )
        )
    if target.normalized and not h["normalize_output"]:
        raise SchemaError(
            f"target {target.version} is normalized but {h_dir} does not "
            f"normalise its output (normalize_output=false)"
        )
    if g_files is not None:
        g_dir, g = _spec(g_files, G)
        expect.append(
            (f"source {source.version} width", source.width, f"{g_dir} d_old", g["d_old"])
        )
        expect.append(
            (
                f"source {source.version} side_info_width",
                source.side_info_width,
                f"{g_dir} d_side",
                g["d_side"] or None,
            )
        )
        expect.append(
            (
                f"target {target.version} side_info_width",
                target.side_info_width,
                f"{g_dir} d_new",
                g["d_new"],
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
