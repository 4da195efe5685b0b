"""Pass A of the partial backfill: which rows to re-extract, decided with scalars on the driver.

Every row gets a selection key, larger first: FastFill's ``sigma`` (h's predicted log-variance,
Jaeckle et al., ICLR 2023) for ``order="uncertainty"``, or a seeded hash of the id in [0, 1)
(:func:`random_keys`) for ``order="random"``; rows a partial source already holds ``extracted``
get ``+inf`` (they stay extracted, so they count first against the budget). The ``k`` selected
rows are the first ``k`` in (key descending, id ascending) order: Ray Data's distributed
``sort`` puts the keys in that order and the driver fetches only the ``k``-th row, the
:class:`Threshold`. A row is selected iff ``key > key_k or (key == key_k and id <= id_k)``:
exactly ``k`` rows (ids are unique), ties broken by id as ``raycompat.backfill.backfill_order``
breaks them by row.

An actor pool computes the keys chunk by chunk (the writer's chunks) and writes each chunk's
``(id, key)`` rows to ``<staging>/_keys/<part>`` (hidden from the store's listings), with the
number of rows the source holds extracted in the file's metadata (summed from the footers,
O(parts), without reading a row). The writer
reads its chunk's keys back instead of recomputing ``sigma``: a recomputation on other hardware
or in other batch shapes may differ in the last bit, and one flipped comparison at the threshold
would select ``k +- 1`` rows. The keys of finished chunks, and ``_selection.json`` once the
threshold is known, make this pass resumable too.
"""

from __future__ import annotations

import json
import logging
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray
import torch

from raycompat.cluster.pipelines.inputs import iter_chunk_batches
from raycompat.cluster.pipelines.parts import Chunk
from raycompat.cluster.pipelines.runner import ChunkWorker, chunk_worker_kwargs, run_chunks
from raycompat.cluster.pipelines.weights import Shared, transformation_of
from raycompat.config.pipelines import RunOptions
from raycompat.progress import Progress
from raycompat.store import GalleryStore, SchemaError, Staging, StoreError, VersionInfo
from raycompat.store.commit.checks import RECORD_READERS
from raycompat.store.commit.part_record import hash_ids
from raycompat.store.read.parquet import open_parquet
from raycompat.store.read.vectors import vectors
from raycompat.transformations import H

logger = logging.getLogger(__name__)

ORDERS = ("uncertainty", "random")
KEYS_DIR = "_keys"
SELECTION_FILE = "_selection.json"
EXTRACTED_KEY = "raycompat.extracted"  # key files' metadata: rows extracted in the source
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def random_keys(ids: pa.Array | pa.ChunkedArray, seed: int) -> np.ndarray:
    """A seeded pseudo-random key in [0, 1) per id, float64 ``(N,)``: the id's 64-bit hash
    (``part_record.hash_ids``, the same on every machine) xor the seed, through splitmix64."""
    mixed = hash_ids(ids) ^ _splitmix64(np.array([seed], dtype=np.uint64))[0]
    return (_splitmix64(mixed) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Steele et al.'s splitmix64 finaliser on uint64 arrays (arithmetic mod 2^64)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
    return x ^ (x >> np.uint64(31))


@dataclass
class Threshold:
    """The ``k``-th row in (key descending, id ascending) order."""

    key: float
    id: int | str

    def selects(self, keys: np.ndarray, ids: pa.Array) -> np.ndarray:
        """Bool ``(N,)``: rows at or before the threshold in the order."""
        chosen = keys > self.key
        tie = keys == self.key
        if tie.any():
            at_most = pc.less_equal(ids, pa.scalar(self.id, ids.type))
            chosen |= tie & at_most.to_numpy(zero_copy_only=False)
        return chosen


@dataclass
class Selection:
    """``k`` of ``rows`` rows to hold new-model embeddings; ``already_extracted`` of them are
    extracted in the source already. ``threshold`` is None when ``k`` is 0 or ``rows``."""

    rows: int
    k: int
    already_extracted: int = 0
    threshold: Threshold | None = None

    def selects(self, keys: np.ndarray | None, ids: pa.Array) -> np.ndarray:
        if self.threshold is None:
            return np.full(len(ids), self.k == self.rows)
        return self.threshold.selects(keys, ids)

    def to_json(self) -> bytes:
        raw = asdict(self)
        if self.threshold is not None:  # hex: exact for every float64, inf included
            raw["threshold"]["key"] = float(self.threshold.key).hex()
        return json.dumps(raw, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, source: str) -> Selection:
        try:
            raw = json.loads(data)
            threshold = raw.pop("threshold")
            if threshold is not None:
                threshold = Threshold(float.fromhex(threshold["key"]), threshold["id"])
            return cls(**raw, threshold=threshold)
        except (ValueError, KeyError, TypeError) as error:
            raise StoreError(
                f"{source}: unreadable selection ({error}); abort this staging area to start over"
            ) from None


def key_path(staging: Staging, part: str) -> str:
    return posixpath.join(staging.path, KEYS_DIR, part)


def read_keys(staging: Staging, chunk: Chunk) -> pa.Table:
    """The ``(id, key)`` rows of ``chunk``, in the chunk's row order."""
    return pq.read_table(key_path(staging, chunk.part), filesystem=staging.filesystem)


class KeyChunks(ChunkWorker):
    """Actor: builds ``h`` once from the object store (when keys are sigmas), writes each
    chunk's keys to ``_keys/``."""

    def __init__(
        self,
        *,
        source: VersionInfo,
        transformation: Shared | str | None,
        order: str,
        seed: int,
        partial: bool,
        **base,
    ) -> None:
        super().__init__(**base)
        self.source, self.order, self.seed, self.partial = source, order, seed, partial
        sigma_from_h = order == "uncertainty" and not partial
        self.h = transformation_of(transformation, H).to(self.device) if sigma_from_h else None

    def columns(self) -> list[str]:
        if self.partial:
            return ["id", "provenance"] + (["uncertainty"] if self.order == "uncertainty" else [])
        if self.h is None:
            return ["id"]
        return ["id", "embedding"] + (["side_info"] if self.h.d_side else [])

    def keys(self, batch: pa.RecordBatch, source: str) -> np.ndarray:
        ids = batch.column("id")
        if self.h is not None:
            side = vectors(batch, "side_info") if self.h.d_side else None
            with torch.inference_mode():  # fp32: bf16's 8-bit mantissa would tie most sigmas
                _, sigma = self.h.forward_with_uncertainty(
                    torch.from_numpy(vectors(batch, "embedding")).to(self.device),
                    None if side is None else torch.from_numpy(side).to(self.device),
                )
            keys = sigma.float().cpu().numpy().astype(np.float64)
            bad = np.flatnonzero(~np.isfinite(keys))
            if bad.size:
                raise SchemaError(
                    f"{source}: h gives a non-finite sigma for {bad.size} row(s), first id "
                    f"{ids[int(bad[0])].as_py()!r}"
                )
            return keys
        if self.order == "uncertainty":
            keys = batch.column("uncertainty").to_numpy(zero_copy_only=False).astype(np.float64)
        else:
            keys = random_keys(ids, self.seed)
        if self.partial:
            extracted = pc.equal(batch.column("provenance"), "extracted")
            keys[extracted.to_numpy(zero_copy_only=False)] = np.inf
        return keys

    def __call__(self, batch: dict) -> dict:
        results = {"part": [], "rows": []}
        for item in batch["chunk"]:
            chunk = Chunk(**json.loads(item))
            self.write(chunk)
            results["part"].append(chunk.part)
            results["rows"].append(chunk.rows)
        return results

    def write(self, chunk: Chunk) -> None:
        """Stream the chunk's keys into ``_tmp/``, then move the file to ``_keys/<part>``."""
        staging, source = self.staging, self.store.backend.uri(chunk.path)
        tmp, rows, extracted = staging.tmp_path(f"keys-{chunk.part}"), 0, 0
        try:
            with pq.ParquetWriter(tmp, self.schema, filesystem=staging.filesystem) as writer:
                for batch in iter_chunk_batches(
                    self.store, chunk, self.source, self.run.batch_size, self.columns()
                ):
                    keys = self.keys(batch, source)
                    table = pa.table({"id": batch.column("id"), "key": pa.array(keys)})
                    writer.write_table(table.cast(self.schema))
                    rows += batch.num_rows
                    extracted += int(np.isposinf(keys).sum()) if self.partial else 0
                writer.add_key_value_metadata({EXTRACTED_KEY: str(extracted)})
            if rows != chunk.rows:
                raise StoreError(f"{source}: read {rows} rows, the chunk has {chunk.rows}")
            staging.check_writable(f"publish the keys of {chunk.part}")
            final = key_path(staging, chunk.part)
            if staging.filesystem.type_name == "local":
                staging.filesystem.create_dir(posixpath.dirname(final), recursive=True)
            staging.filesystem.move(tmp, final)
        except BaseException:
            staging.drop_tmp(tmp)
            raise


def done_keys(staging: Staging) -> set[str]:
    """Names of the chunks whose keys are written (a key file appears only when complete)."""
    selector = pafs.FileSelector(posixpath.join(staging.path, KEYS_DIR), allow_not_found=True)
    return {e.base_name for e in staging.filesystem.get_file_info(selector)}


def extracted_in_source(staging: Staging, chunks: list[Chunk]) -> int:
    """Rows the source holds extracted, summed from the key files' footers."""

    def count(chunk: Chunk) -> int:
        path = key_path(staging, chunk.part)
        with open_parquet(staging.filesystem, path, staging.uri_of(path)) as parquet:
            return int(parquet.metadata.metadata[EXTRACTED_KEY.encode()])

    with ThreadPoolExecutor(RECORD_READERS) as pool:
        return sum(pool.map(count, chunks))


def stored_selection(staging: Staging) -> Selection | None:
    """The selection an earlier run of this staging area decided, or None."""
    path = staging.meta_path(SELECTION_FILE)
    try:
        with staging.filesystem.open_input_stream(path) as handle:
            return Selection.from_json(handle.read(), staging.uri_of(path))
    except FileNotFoundError:
        return None


def select_rows(
    store: GalleryStore,
    gallery: str,
    staging: Staging,
    chunks: list[Chunk],
    k: int,
    worker_kwargs: dict,
    run: RunOptions,
    id_type: pa.DataType,
) -> Selection:
    """Pass A: write the keys of every chunk not done yet, then find the ``k``-th key.

    Returns the :class:`Selection`, with ``already_extracted`` counted from the key files
    when the source is a partial backfill.
    """
    rows = sum(c.rows for c in chunks)
    done = done_keys(staging)
    todo = [c for c in chunks if c.part not in done]
    name = f"partial backfill keys {gallery}/{staging.info.version}"
    progress = Progress(name, rows, rows - sum(c.rows for c in todo), run.progress_every_s)
    schema = pa.schema([pa.field("id", id_type, nullable=False), pa.field("key", pa.float64())])
    base = chunk_worker_kwargs(store, gallery, staging, schema)
    run_chunks(todo, KeyChunks, {**base, **worker_kwargs}, run, progress)
    already = extracted_in_source(staging, chunks) if worker_kwargs["partial"] else 0
    threshold = None
    if 0 < k < rows and already <= k:
        keys = ray.data.read_parquet(
            [key_path(staging, c.part) for c in chunks], filesystem=staging.filesystem
        )
        ordered = keys.sort(["key", "id"], descending=[True, False])
        kth = ordered.split_at_indices([k - 1, k])[1].take(1)[0]
        threshold = Threshold(float(kth["key"]), _python(kth["id"]))
    return Selection(rows, k, already, threshold)


def _python(value):
    return value.item() if isinstance(value, np.generic) else value
