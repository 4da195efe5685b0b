"""Extraction's decode stage: CPU workers turn chunk descriptors into decoded blocks.

    chunk (one row: its JSON) -> decode_chunks (Ray tasks of 1 CPU; each worker process opens
                                 the source once, ``ChunkDecoder``)
        -> one row: chunk, images uint8 or float32 (rows, C, H, W), rows (Arrow IPC: id
           [, label])
        -> the model actors (``extract.ExtractChunks``), which embed it and write its part

One chunk is one block, and the model actor that receives it writes the chunk's part, so a part
is still a deterministic function of its chunk (``resume.py``). A chunk is decoded and
augmented exactly as the model actor did it before this stage existed: ``source.batches`` with
the generator seeded per chunk, so the pixels are the same bit for bit. A source that decodes to
uint8 (JPEG/PNG Parquet in RGB or L, image folders, CASIA, RecordIO, MNIST, CIFAR) hands its
uint8 pixels over, a quarter of float32's bytes through the object store, and the model actor
widens them (on a GPU after the copy): ``uint8_batch_to_tensor``, the same values as the float
path. Others (the synthetic generator, a ``transform``) hand float32 over. Extraction's chunks
are capped at ``run.decode_block_mib`` of the block as handed over (:func:`chunk_rows`), e.g.
128 MiB: 3,566 images of 3 x 112 x 112 as uint8, 891 as float32.

Pool sizes (:func:`plan_pools`): the model actors as configured (``pool: fixed``) or one per
GPU (``pool: auto``; half the CPUs without GPUs), then every CPU they leave to decode workers,
unless ``run.decode_workers`` is set. No Ray here: the caller passes the nodes' resources.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from raycompat.cluster.pipelines.parts import Chunk
from raycompat.cluster.pipelines.sources import SourceSpec, open_source
from raycompat.config.pipelines import RunOptions
from raycompat.data.augment import AUGMENTATIONS


def chunk_rows(run: RunOptions, image_shape: Sequence[int] | None, itemsize: int = 4) -> int:
    """Rows per extraction chunk: ``run.rows_per_file``, or fewer so that a chunk's decoded
    ``image_shape`` images of ``itemsize`` bytes a value (1: uint8, 4: float32, as the source
    hands them over) fit in ``run.decode_block_mib`` MiB. A cap of one model batch or more is
    rounded down to whole batches, so the model sees the batches it would see in one long chunk
    (and the same embeddings, bit for bit, on CPU)."""
    if image_shape is None:  # an empty source
        return run.rows_per_file
    cap = max(1, run.decode_block_mib * 2**20 // (itemsize * math.prod(image_shape)))
    if cap >= run.batch_size:
        cap -= cap % run.batch_size
    return min(run.rows_per_file, cap)


@dataclass(frozen=True)
class Pools:
    """Sizes of an extraction's two pools: ``model`` is the run as the model actors use it
    (``actors``, ``num_gpus_per_actor``; ``pool="fixed"``), ``decode_workers`` CPU workers."""

    model: RunOptions
    decode_workers: int


def plan_pools(run: RunOptions, nodes: Sequence[Mapping[str, float]], chunks: int) -> Pools:
    """Size both pools from ``nodes`` (each alive node's resources, ``{"CPU": 16, "GPU": 1}``).

    Model actors: ``run.actors`` x ``run.num_gpus_per_actor`` GPU (``pool: fixed``), or one
    actor per GPU (``pool: auto``; without GPUs, one per ``2 x threads_per_actor`` CPUs), never
    more than the GPUs hold, nor than there are chunks, and leaving one CPU to decode. Decode
    workers: ``run.decode_workers``, else every CPU the model actors leave (one each), at most
    one per chunk. Both pools are fixed and start at once, so sizes that do not fit the CPUs
    would wait forever: they are refused, naming the numbers.
    """
    cpus = int(sum(n.get("CPU", 0) for n in nodes))
    gpus = sum(n.get("GPU", 0) for n in nodes)
    threads, chunks = run.threads_per_actor, max(chunks, 1)
    if run.pool == "auto":
        actors, per_gpu = (int(gpus), 1.0) if gpus >= 1 else (cpus // (2 * threads), 0.0)
    else:
        actors, per_gpu = run.actors, run.num_gpus_per_actor
    if per_gpu > 0:
        actors = min(actors, math.floor(gpus / per_gpu + 1e-9))
        if actors < 1:
            raise ValueError(f"run.num_gpus_per_actor is {per_gpu} but the cluster has {gpus} GPU")
    actors = max(1, min(actors, chunks, (cpus - 1) // threads))
    decode = run.decode_workers or max(1, min(cpus - actors * threads, chunks))
    if actors * threads + decode > cpus:
        raise ValueError(
            f"extraction needs {actors} model actor(s) x {threads} CPU + {decode} decode "
            f"worker(s) x 1 CPU, but the cluster has {cpus} CPU"
        )
    model = dataclasses.replace(run, actors=actors, num_gpus_per_actor=per_gpu, pool="fixed")
    return Pools(model, decode)


# This process's decoder (tasks reuse their worker process: the source is opened once per
# process, and a later pipeline's source replaces it)
_DECODER: dict[str, ChunkDecoder] = {}


def decode_chunks(batch: dict, *, source: SourceSpec, augment: str, seed: int) -> dict:
    """The decode stage's ``map_batches`` function: each chunk's row -> its decoded block."""
    key = repr((source, augment, seed))
    if key not in _DECODER:
        _DECODER.clear()
        _DECODER[key] = ChunkDecoder(source, augment, seed)
    return _DECODER[key](batch)


class ChunkDecoder:
    """Opens the image source once, then turns chunk descriptors into decoded blocks."""

    def __init__(self, source: SourceSpec, augment: str, seed: int) -> None:
        torch.set_num_threads(1)  # one CPU each; the pool is the parallelism
        self.source = open_source(source)
        self.augment = AUGMENTATIONS.get(augment)
        self.seed = seed

    def __call__(self, batch: dict) -> dict:
        blocks = {"chunk": [], "images": [], "rows": []}
        for item in batch["chunk"]:
            images, rows = self.decode(Chunk(**json.loads(item)))
            blocks["chunk"].append(item)
            blocks["images"].append(images)
            blocks["rows"].append(rows)
        return blocks

    def decode(self, chunk: Chunk) -> tuple[np.ndarray, bytes]:
        """``(images (rows, C, H, W), rows)`` of ``chunk``: the images as uint8 where the source
        decodes to it, else float32; ``rows`` is an Arrow IPC stream of its ``id`` (and
        ``label``) columns, whatever the id type.

        The chunk is decoded in one batch (the pixels and augmentation draws of any batching):
        the tensor the source returns is the block, not copied into one.
        """
        # Seeded per chunk, so a redone chunk sees the same augmentation as the first try.
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + chunk.start)
        batches = list(self.source.batches(chunk, chunk.rows, self.augment, generator, True))
        shapes = [tuple(images.shape[1:]) for _, images, _ in batches]
        if len(set(shapes)) > 1:
            raise ValueError(
                f"{where(chunk)}: images of sizes {sorted(set(shapes))} (C, H, W); the images "
                f"of one chunk are one block and must share a size (set an image_size)"
            )
        images = torch.cat([b[1] for b in batches]) if len(batches) > 1 else batches[0][1]
        if len(images) != chunk.rows:
            raise ValueError(f"{where(chunk)}: the source gave {len(images)} rows")
        columns = {"id": pa.concat_arrays([pa.array(ids) for ids, _, _ in batches])}
        if batches[0][2] is not None:
            columns["label"] = pa.array(np.concatenate([b[2] for b in batches]), pa.int64())
        block = np.ascontiguousarray(images.numpy())  # no copy: already so
        return block, encode_rows(pa.table(columns))


def where(chunk: Chunk) -> str:
    name = chunk.path or f"input {chunk.input}"
    return f"{name} rows {chunk.start}..{chunk.stop} (chunk {chunk.part})"


def encode_rows(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_rows(data: bytes) -> pa.Table:
    """The ``rows`` of a decoded block: ``id`` (and ``label``), one chunk each."""
    return pa.ipc.open_stream(data).read_all().combine_chunks()
