"""Batch decoding (what extraction reads) gives exactly the pixels of per-image decoding (what
training reads): ``decode_images`` vs ``read_image``, ``dataset.batch`` vs ``dataset[i]`` for every
reader that overrides it, and the pipeline source vs training's ``load_images``."""

from __future__ import annotations

import io
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from raycompat.cluster.pipelines.parts import plan_range_chunks
from raycompat.cluster.pipelines.sources import SourceSpec, open_source
from raycompat.data import (
    ArrayDataset,
    CorruptDataError,
    EncodedImageDataset,
    ImageFolder,
    InsightfaceRecordDataset,
    SyntheticIdentities,
    read_image,
    write_insightface_recordio,
)
from raycompat.data.augment import AUGMENTATIONS
from raycompat.data.base import as_float_images, uint8_batch_to_tensor
from raycompat.data.image_folder import decode_images
from raycompat.train.data import load_images


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def photos(n: int, size=(29, 37), seed: int = 0) -> list[Image.Image]:
    """Smooth RGB images (what JPEG is made for) of an odd size."""
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)).resize(
            (size[1], size[0]), Image.Resampling.BILINEAR
        )
        for _ in range(n)
    ]


ENCODINGS = {
    "jpeg": lambda im: encode(im, "JPEG", quality=90),
    "jpeg_progressive_444": lambda im: encode(im, "JPEG", progressive=True, subsampling=0),
    "jpeg_grey": lambda im: encode(im.convert("L"), "JPEG"),
    "jpeg_cmyk": lambda im: encode(im.convert("CMYK"), "JPEG"),
    "png": lambda im: encode(im, "PNG"),
    "png_palette": lambda im: encode(im.convert("P"), "PNG"),
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("size", [None, (16, 20), (40, 52), (29, 37)])
def test_decode_images_equals_read_image_bit_for_bit(encoding, mode, size):
    encoded = [ENCODINGS[encoding](im) for im in photos(5)]
    expected = torch.stack([read_image(e, mode=mode, size=size) for e in encoded])
    assert torch.equal(decode_images(encoded, mode=mode, size=size), expected)


def test_decode_images_mixed_formats_and_other_modes():
    images = photos(4)
    encoded = [encode(im, "JPEG") if i % 2 else encode(im, "PNG") for i, im in enumerate(images)]
    for mode in ("RGB", "L", "RGBA"):
        expected = torch.stack([read_image(e, mode=mode) for e in encoded])
        assert torch.equal(decode_images(encoded, mode=mode), expected)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda data: data[: len(data) // 2],  # truncated: no EOI, Pillow decides
        lambda data: data[:3] + b"\x00" * (len(data) - 5) + data[-2:],  # SOI..EOI, garbage
        lambda data: b"not an image at all",
        lambda data: b"",
    ],
)
def test_a_corrupt_image_in_a_batch_is_named(corrupt):
    encoded = [encode(im, "JPEG") for im in photos(4)]
    encoded[2] = corrupt(encoded[2])
    names = [f"gallery.parquet row {10 + i}" for i in range(4)]
    with pytest.raises(CorruptDataError, match=r"cannot decode image gallery\.parquet row 12: "):
        decode_images(encoded, names=names)


def test_images_of_different_sizes_need_an_image_size():
    encoded = [encode(photos(1, (20, 20))[0], "JPEG"), encode(photos(1, (24, 20))[0], "JPEG")]
    with pytest.raises(ValueError, match=r"b is \(3, 24, 20\).*set an image_size"):
        decode_images(encoded, names=["a", "b"])
    assert decode_images(encoded, size=(8, 8)).shape == (2, 3, 8, 8)


def flip_every_row(image: torch.Tensor) -> torch.Tensor:
    return image.flip(-1)


def readers(tmp_path) -> dict:
    """One dataset per reader that overrides ``load_batch``, synthetic for the default (stacked
    ``load_image``); a transform on two of them."""
    rng = np.random.default_rng(1)
    images = photos(12, (26, 30))
    for i, image in enumerate(images):
        folder = tmp_path / "folders" / f"class{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:02d}.{'jpg' if i % 4 else 'png'}")
    encoded = [encode(im, "JPEG") for im in images]
    rec, idx = tmp_path / "faces.rec", tmp_path / "faces.idx"
    write_insightface_recordio(rec, idx, [(i % 4, e) for i, e in enumerate(encoded)])
    return {
        "array_colour": ArrayDataset(rng.integers(0, 256, (9, 7, 5, 3), dtype=np.uint8), [0] * 9),
        "array_grey": ArrayDataset(
            rng.integers(0, 256, (9, 13, 13), dtype=np.uint8), [0] * 9, transform=flip_every_row
        ),
        "synthetic": SyntheticIdentities(4, 3, image_size=13, channels=1, seed=2, difficulty=2.0),
        "synthetic_rgb": SyntheticIdentities(3, 4, image_size=16, seed=5),
        "image_folder": ImageFolder(tmp_path / "folders", image_size=(24, 20)),
        "image_folder_grey": ImageFolder(tmp_path / "folders", image_size=(32, 40), mode="L"),
        "encoded": EncodedImageDataset(encoded, [0] * 12, "lfw.bin", transform=flip_every_row),
        "recordio": InsightfaceRecordDataset(rec, idx, image_size=20),
        "subset": ImageFolder(tmp_path / "folders", image_size=16).subset([5, 1, 7, 3, 0]),
    }


def test_every_reader_batch_equals_its_items(tmp_path):
    for name, dataset in readers(tmp_path).items():
        rows = np.random.default_rng(0).permutation(len(dataset))[:7]
        expected = torch.stack([dataset[int(r)][0] for r in rows])
        assert torch.equal(dataset.batch(rows), expected), name


UINT8_READERS = {"array_colour", "image_folder", "image_folder_grey", "recordio", "subset"}


def test_a_uint8_batch_widens_to_exactly_the_float_batch(tmp_path):
    """What the loaders hand over (``batch_uint8``): uint8 for the readers that decode to it,
    None for a rendered one or one with a transform; ``batch_to_hand_over`` falls back to the
    float batch, and ``as_float_images`` of it is the float batch either way."""
    for name, dataset in readers(tmp_path).items():
        rows = np.random.default_rng(0).permutation(len(dataset))[:7]
        got = dataset.batch_uint8(rows)
        handed = dataset.batch_to_hand_over(rows)
        assert handed.dtype == (torch.uint8 if name in UINT8_READERS else torch.float32), name
        assert torch.equal(as_float_images(handed), dataset.batch(rows)), name
        if name not in UINT8_READERS:
            assert got is None, name
            continue
        assert got.dtype == torch.uint8 and got.is_contiguous(), name
        assert torch.equal(uint8_batch_to_tensor(got), dataset.batch(rows)), name


def test_a_missing_image_file_is_named_in_a_batch(tmp_path):
    dataset = readers(tmp_path)["image_folder"]
    (tmp_path / "folders" / "class2" / "05.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"image file not found: .*class2/05\.jpg"):
        dataset.batch(np.arange(len(dataset)))


@pytest.mark.parametrize("augment", ["none", "flip", "crop_flip"])
def test_extraction_source_reads_what_training_reads(augment):
    """No train/serve skew: the pipeline's batches equal training's loader on the same rows and
    seed, augmentation draws included."""
    options = {"num_classes": 5, "images_per_class": 7, "image_size": 12, "seed": 3}
    source = open_source(SourceSpec(kind="dataset", name="synthetic", options=options))
    (chunk,) = plan_range_chunks(35, 100)
    generator = torch.Generator().manual_seed(11)
    batches = list(source.batches(chunk, 16, AUGMENTATIONS.get(augment), generator))
    generator = torch.Generator().manual_seed(11)
    for ids, images, labels in batches:
        assert torch.equal(images, load_images(source.dataset, ids, augment, generator))
        np.testing.assert_array_equal(labels, source.dataset.labels[ids])


def test_parquet_source_decodes_batches_and_names_a_bad_row(tmp_path):
    images = photos(10, (30, 30))
    encoded = [encode(im, "JPEG") for im in images]
    path = tmp_path / "images.parquet"
    pq.write_table(
        pa.table({"id": [f"i{r}" for r in range(10)], "image": encoded}), path, row_group_size=5
    )
    spec = SourceSpec(kind="parquet_images", paths=[str(path)], image_size=24)
    source = open_source(spec)
    (chunk,) = source.plan(100)
    got = torch.cat([b[1] for b in source.batches(chunk, 4, AUGMENTATIONS.get("none"), None)])
    assert torch.equal(got, torch.stack([read_image(e, size=(24, 24)) for e in encoded]))

    encoded[7] = encoded[7][:100]
    pq.write_table(
        pa.table({"id": [f"i{r}" for r in range(10)], "image": encoded}), path, row_group_size=5
    )
    with pytest.raises(CorruptDataError, match=r"cannot decode image .*images\.parquet row 7: "):
        list(source.batches(chunk, 4, AUGMENTATIONS.get("none"), None))


def naive_synthetic_image(data: SyntheticIdentities, index: int) -> torch.Tensor:
    """The generator's formula for one row (module docstring), written out plainly."""
    rng = np.random.default_rng([data.seed, 2, index])
    d, size, rank = data.difficulty, data.image_size, data.rank
    code = data.class_code(int(data.labels[index])) + 0.9 * d * rng.standard_normal(rank)
    signal = (code @ data.basis / math.sqrt(rank)).reshape(data.channels, size, size)
    limit = int(round(d * size / 8))
    shift = rng.integers(-limit, limit + 1, size=2)
    signal = np.roll(signal, (int(shift[0]), int(shift[1])), axis=(1, 2))
    contrast = math.exp(0.3 * d * rng.standard_normal())
    brightness = 0.5 * d * rng.standard_normal()
    noise = 0.5 * d * rng.standard_normal(signal.shape)
    return torch.sigmoid(torch.from_numpy((contrast * signal + brightness + noise).astype("f4")))


@pytest.mark.parametrize("size, channels, difficulty", [(28, 3, 0.0), (17, 1, 2.0), (32, 3, 1.0)])
def test_synthetic_batches_render_each_row_as_the_formula_does(size, channels, difficulty):
    data = SyntheticIdentities(
        7, 5, image_size=size, channels=channels, seed=4, difficulty=difficulty
    )
    rows = np.array([34, 0, 12, 12, 5])
    want = torch.stack([naive_synthetic_image(data, int(r)) for r in rows])
    assert torch.equal(data.load_batch(rows), want)  # bit for bit, in any batch
