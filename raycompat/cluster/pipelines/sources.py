"""Image inputs of the extraction pipeline, one registry: ``dataset`` and ``parquet_images``.

- ``dataset``: any registered reader (``raycompat.data.DATASETS``: image folders, insightface
  RecordIO, CIFAR, MNIST-5k, synthetic...); ids are row numbers (int64), labels come along.
- ``parquet_images``: Parquet files with an ``id`` column (string or int64), encoded image bytes
  (``image``, JPEG/PNG...) and optionally ``label`` (int64).

A source plans chunks on the driver (``plan``, with ``image_shape``: one image decoded there,
which sizes extraction's chunks) and yields ``(ids, images (B, C, H, W) float in [0, 1], labels
(B,) or None)`` for one chunk inside a decode worker (``batches``); the dataset or file is
opened once per worker. Images are decoded a batch at a time (``dataset.batch(rows)``,
``decode_images``), with exactly the pixels that training reads image by image. With
``uint8=True`` a source that decodes to uint8 yields those pixels instead, a quarter of the
bytes to hand over (``uint8_batch_to_tensor`` of them is exactly the float batch); flips and
crops are copies, so they apply to either. No Ray here.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import torch

from raycompat.cluster.pipelines.parts import Chunk, plan_file_chunks, plan_range_chunks
from raycompat.config.pipelines import SourceSpec
from raycompat.data import create_dataset
from raycompat.data.augment import Augmentation
from raycompat.data.image_folder import UINT8_MODES, as_hw, decode_images, decode_images_uint8
from raycompat.registry import Registry
from raycompat.store import SchemaError
from raycompat.store.read.parquet import open_parquet

SOURCES: Registry = Registry("image source")
Batch = tuple[np.ndarray, torch.Tensor, np.ndarray | None]


@SOURCES.register("dataset")
class DatasetSource:
    def __init__(self, spec: SourceSpec) -> None:
        self.dataset = create_dataset(spec.name, **spec.options)

    def plan(self, rows_per_file: int) -> list[Chunk]:
        return plan_range_chunks(len(self.dataset), rows_per_file)

    def id_type_and_labels(self) -> tuple[str, bool]:
        return "int64", True

    def image_shape(self) -> tuple[int, ...] | None:
        """``(C, H, W)`` of row 0 as decoded, or None for an empty dataset."""
        if not len(self.dataset):
            return None
        return tuple(self.dataset.batch(np.zeros(1, dtype=np.int64)).shape[1:])

    def hands_uint8(self) -> bool:
        """Whether ``batches(..., uint8=True)`` yields uint8 (the reader decodes to it)."""
        return len(self.dataset) > 0 and self.dataset.batch_uint8(np.zeros(1, np.int64)) is not None

    def batches(
        self, chunk: Chunk, batch_size: int, augment, generator, uint8: bool = False
    ) -> Iterator[Batch]:
        for start in range(chunk.start, chunk.stop, batch_size):
            rows = np.arange(start, min(start + batch_size, chunk.stop), dtype=np.int64)
            images = self.dataset.batch_to_hand_over(rows) if uint8 else self.dataset.batch(rows)
            yield rows, augment_batch(images, augment, generator), self.dataset.labels[rows]


@SOURCES.register("parquet_images")
class ParquetImageSource:
    REQUIRED = ("id", "image")

    def __init__(self, spec: SourceSpec) -> None:
        if not spec.paths:
            raise ValueError("source.paths: parquet_images needs at least one file")
        self.spec, self.size = spec, as_hw(spec.image_size)
        self.files = [pafs.FileSystem.from_uri(p) for p in spec.paths]

    def plan(self, rows_per_file: int) -> list[Chunk]:
        chunks = []
        for index, (uri, (fs, path)) in enumerate(zip(self.spec.paths, self.files, strict=True)):
            with open_parquet(fs, path, uri) as parquet:
                self.check_columns(uri, parquet)
                chunks += plan_file_chunks(index, path, parquet.metadata, rows_per_file)
        return chunks

    def check_columns(self, uri: str, parquet) -> None:
        names = parquet.schema_arrow.names
        missing = [c for c in self.REQUIRED if c not in names]
        if missing:
            raise SchemaError(f"{uri}: missing column(s) {missing}; columns are {names}")

    def id_type_and_labels(self) -> tuple[str, bool]:
        fs, path = self.files[0]
        with open_parquet(fs, path, self.spec.paths[0]) as parquet:
            schema = parquet.schema_arrow
        id_type = "int64" if pa.types.is_integer(schema.field("id").type) else "string"
        return id_type, "label" in schema.names

    def image_shape(self) -> tuple[int, ...] | None:
        """``(C, H, W)`` of the first image of the first file holding rows, as decoded, or
        None when every file is empty."""
        for uri, (fs, path) in zip(self.spec.paths, self.files, strict=True):
            with open_parquet(fs, path, uri) as parquet:
                self.check_columns(uri, parquet)
                if not parquet.metadata.num_rows:
                    continue
                rows = [
                    parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)
                ]
                group = next(g for g, n in enumerate(rows) if n)
                first = next(parquet.iter_batches(1, [group], ["image"])).column("image")
            if first.null_count:
                raise SchemaError(f"{uri}: row 0 has a null image")
            image = decode_images(
                first.to_pylist(), mode=self.spec.mode, size=self.size, names=[f"{uri} row 0"]
            )
            return tuple(image.shape[1:])
        return None

    def hands_uint8(self) -> bool:
        """Whether ``batches(..., uint8=True)`` yields uint8 (RGB and L decode to it)."""
        return self.spec.mode in UINT8_MODES

    def batches(
        self, chunk: Chunk, batch_size: int, augment, generator, uint8: bool = False
    ) -> Iterator[Batch]:
        uri, (fs, path) = self.spec.paths[chunk.input], self.files[chunk.input]
        decode = decode_images_uint8 if uint8 and self.hands_uint8() else decode_images
        columns = list(self.REQUIRED)
        offset = chunk.start
        with open_parquet(fs, path, uri) as parquet:
            if "label" in parquet.schema_arrow.names:
                columns.append("label")
            for batch in parquet.iter_batches(batch_size, chunk.row_groups, columns):
                encoded = batch.column("image")
                if encoded.null_count:
                    first = encoded.is_null().to_pylist().index(True)
                    raise SchemaError(f"{uri}: row {offset + first} has a null image")
                images = decode(
                    encoded.to_pylist(),
                    mode=self.spec.mode,
                    size=self.size,
                    names=[f"{uri} row {offset + i}" for i in range(batch.num_rows)],
                )
                labels = batch.column("label") if "label" in columns else None
                ids = batch.column("id")
                if ids.null_count:
                    raise SchemaError(f"{uri}: null id in rows {offset}..{offset + len(batch)}")
                yield (
                    ids.to_numpy(zero_copy_only=False),
                    augment_batch(images, augment, generator),
                    None if labels is None else labels.cast(pa.int64()).to_numpy(),
                )
                offset += batch.num_rows


def augment_batch(images: torch.Tensor, augment: Augmentation, generator) -> torch.Tensor:
    """``augment`` drawn image by image in row order (each draw from ``generator`` lands on the
    same image as in training's loader), applied to the batch; nothing to do for ``none``."""
    if not augment.params:
        return images
    return augment.apply(images, augment.draw_batch(len(images), generator))


def open_source(spec: SourceSpec):
    return SOURCES.create(spec.kind, spec=spec)


def source_name(spec: SourceSpec) -> str:
    """How errors name a source: ``dataset 'mnist5k'``."""
    return f"{spec.kind} {spec.name!r}"


def images_of_rows(source, rows: np.ndarray, where: str, name: str) -> torch.Tensor:
    """The images of ``rows`` of a ``dataset`` source, whose row numbers are a version's ids
    (the partial backfill re-extracts them, a map's pairs re-embed them); an id past the
    dataset's end is one ``SchemaError`` naming ``where`` and the source ``name``."""
    try:
        return source.dataset.batch(rows)
    except IndexError as error:
        raise SchemaError(
            f"{where}: ids are row numbers of the image source {name}, but {error}"
        ) from None
