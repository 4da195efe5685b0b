"""Extraction's two stages in process (no Ray): a decode worker's blocks through the model
actor give the embeddings of per-image decoding, and a corrupt image fails its chunk by name in
the decode worker, with nothing left behind."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from raycompat.cluster.pipelines import RunOptions, SourceSpec
from raycompat.cluster.pipelines.decode import ChunkDecoder
from raycompat.cluster.pipelines.extract import ExtractChunks
from raycompat.cluster.pipelines.sources import open_source
from raycompat.config.train import ModelSpec
from raycompat.data import CorruptDataError, read_image
from raycompat.store import GalleryStore, VersionInfo, embedding_schema
from raycompat.store.commit.part_record import part_of_file
from raycompat.train.export import build_model, export_model, load_exported_model

ROWS, SIZE = 40, 24


def jpeg_parquet(path: Path, corrupt_row: int | None = None) -> list[bytes]:
    rng = np.random.default_rng(0)
    encoded = []
    for _ in range(ROWS):
        image = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))
        buffer = io.BytesIO()
        image.resize((30, 27), Image.Resampling.BILINEAR).save(buffer, format="JPEG")
        encoded.append(buffer.getvalue())
    if corrupt_row is not None:
        encoded[corrupt_row] = encoded[corrupt_row][:150]  # truncated
    table = pa.table({"id": np.arange(ROWS) * 10, "image": encoded, "label": np.arange(ROWS) % 4})
    pq.write_table(table, path, row_group_size=10)
    return encoded


def worker(tmp_path: Path, source: SourceSpec):
    spec = ModelSpec(
        backbone="lenetpp",
        head="linear",
        num_classes=4,
        embed_dim=8,
        backbone_kwargs={"in_chans": 3, "image_size": SIZE},
    )
    torch.manual_seed(0)
    export_model(tmp_path / "model", build_model(spec).state_dict(), spec)
    store = GalleryStore(str(tmp_path / "store"))
    info = VersionInfo("v1", "lenet", 8, True, "v1 = extract(lenet)")
    staging = store.begin("g", info, "extract-v1")
    run = RunOptions(rows_per_file=20, batch_size=6, actors=1)
    decode = ChunkDecoder(source, "none", 0)
    extract = ExtractChunks(
        model=str(tmp_path / "model"),
        root=store.root,
        storage_options={},
        gallery="g",
        info=info,
        staging_name="extract-v1",
        schema=embedding_schema(8, "int64", with_label=True),
        run=run,
        lease=staging.lease_ref,
    )
    chunks = open_source(source).plan(run.rows_per_file)
    return (decode, extract), chunks, staging


def call(stages: tuple[ChunkDecoder, ExtractChunks], chunk) -> dict:
    decode, extract = stages
    return extract(decode({"chunk": [json.dumps(asdict(chunk))]}))


def test_batched_extraction_equals_per_image_decoding_and_forward(tmp_path):
    encoded = jpeg_parquet(tmp_path / "images.parquet")
    source = SourceSpec(
        kind="parquet_images", paths=[str(tmp_path / "images.parquet")], image_size=SIZE
    )
    stages, chunks, staging = worker(tmp_path, source)
    assert [call(stages, c)["rows"] for c in chunks] == [[20], [20]]
    out = pa.concat_tables([pq.read_table(f) for f in stages[1].staging.files()])  # the actor's
    model = load_exported_model(str(tmp_path / "model"))[0]
    # the old path: Pillow image by image, the model on the same batches of 6
    images = torch.stack([read_image(e, size=(SIZE, SIZE)) for e in encoded])
    with torch.inference_mode():
        expected = torch.cat(
            [
                F.normalize(model.forward_features(images[c.start : c.stop][s : s + 6]), dim=1)
                for c in chunks
                for s in range(0, c.rows, 6)
            ]
        )
    np.testing.assert_array_equal(out["id"].to_numpy(), np.arange(ROWS) * 10)
    embeddings = np.stack(out["embedding"].to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(embeddings, expected.numpy())  # the same batches: bit for bit
    np.testing.assert_array_equal(out["label"].to_numpy(), np.arange(ROWS) % 4)


def test_a_corrupt_image_fails_the_chunk_by_row_and_leaves_no_part(tmp_path):
    jpeg_parquet(tmp_path / "images.parquet", corrupt_row=33)
    source = SourceSpec(
        kind="parquet_images", paths=[str(tmp_path / "images.parquet")], image_size=SIZE
    )
    stages, chunks, staging = worker(tmp_path, source)
    call(stages, chunks[0])
    with pytest.raises(CorruptDataError, match=r"cannot decode image .*images\.parquet row 33"):
        call(stages, chunks[1])
    assert [part_of_file(f) for f in stages[1].staging.files()] == ["part-00000-0000.parquet"]
    assert [part_of_file(f) for f in staging.resume() and staging.files()] == [
        "part-00000-0000.parquet"  # what a rerun's driver finds complete
    ]
    assert not any(Path(staging.path).glob("_tmp/*"))


def test_an_id_past_the_image_source_is_one_error_naming_the_part_and_the_source():
    """The partial backfill and a map's pairs read a version's ids as row numbers of its image
    source: one past the end is a ``SchemaError`` naming the part and the source."""
    from raycompat.cluster.pipelines.sources import images_of_rows, source_name
    from raycompat.store import SchemaError

    spec = SourceSpec(kind="dataset", name="mnist5k", options={"per_class": 2})
    source = open_source(spec)
    assert images_of_rows(source, np.array([0, 19]), "p.parquet", source_name(spec)).shape[0] == 2
    with pytest.raises(SchemaError, match=r"^p\.parquet: ids are row numbers of the image source "
                       r"dataset 'mnist5k', but "):  # fmt: skip
        images_of_rows(source, np.array([3, 20]), "p.parquet", source_name(spec))


@pytest.mark.parametrize("augment", ["none", "crop_flip"])
def test_a_uint8_source_hands_its_pixels_over_as_uint8_with_the_float_values(tmp_path, augment):
    """Decode workers hand the object store a quarter of the bytes where the source decodes to
    uint8; widened, the block is the float path's batch bit for bit, augmentation included."""
    from raycompat.cluster.pipelines.sources import augment_batch
    from raycompat.data.augment import AUGMENTATIONS
    from raycompat.data.base import uint8_batch_to_tensor

    jpeg_parquet(tmp_path / "images.parquet")
    parquet = SourceSpec(
        kind="parquet_images", paths=[str(tmp_path / "images.parquet")], image_size=SIZE
    )
    mnist = SourceSpec(kind="dataset", name="mnist5k", options={"per_class": 2})
    synthetic = SourceSpec(
        kind="dataset",
        name="synthetic",
        options={"num_classes": 2, "images_per_class": 10, "image_size": 8},
    )
    for spec, dtype in ((parquet, np.uint8), (mnist, np.uint8), (synthetic, np.float32)):
        assert open_source(spec).hands_uint8() == (dtype == np.uint8)  # chunks sized by it
        chunk = open_source(spec).plan(10)[1]
        block, _ = ChunkDecoder(spec, augment, 3).decode(chunk)
        assert block.dtype == dtype, spec
        generator = torch.Generator().manual_seed(3 * 1_000_003 + chunk.start)
        [(_, floats, _)] = open_source(spec).batches(  # the float path, the same draws
            chunk, chunk.rows, AUGMENTATIONS.get("none"), None
        )
        expected = augment_batch(floats, AUGMENTATIONS.get(augment), generator)
        widened = torch.from_numpy(block)
        widened = uint8_batch_to_tensor(widened) if dtype == np.uint8 else widened
        assert torch.equal(widened, expected), spec
