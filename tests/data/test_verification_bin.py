"""insightface ``lfw.bin``: written here as insightface does, read back; hostile or malformed
pickles are refused before anything they name is imported or called."""

from __future__ import annotations

import builtins
import collections
import io
import os
import pickle
import struct
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from raycompat.data import (
    CorruptDataError,
    LFWPairs,
    UnsafePickleError,
    create_dataset,
    load_verification_bin,
    read_verification_bin,
)
from raycompat.data.base import uint8_to_tensor
from raycompat.data.verification_bin import consecutive_folds, pair_labels
from raycompat.metrics import verification_accuracy

SAME = [True, False, True, False, True, False]
PAIR = r"expected a pickled \(bins, issame_list\) pair"


def encode(array: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt)
    return buffer.getvalue()


def write_bin(path, payload, protocol=pickle.HIGHEST_PROTOCOL):
    with open(path, "wb") as handle:
        pickle.dump(payload, handle, protocol=protocol)
    return path


@pytest.fixture
def faces():
    """``(2P, 8, 6, 3)`` uint8: a matched pair repeats its left image, a mismatched one does not."""
    rng = np.random.default_rng(0)
    arrays = rng.integers(0, 256, (2 * len(SAME), 8, 6, 3), dtype=np.uint8)
    for i, same in enumerate(SAME):
        if same:
            arrays[2 * i + 1] = arrays[2 * i]
    return arrays


@pytest.fixture
def lfw_bin(tmp_path, faces):
    return write_bin(tmp_path / "lfw.bin", ([encode(a) for a in faces], SAME))


def test_png_images_pairs_labels_and_folds_read_back(lfw_bin, faces):
    pairs = load_verification_bin(lfw_bin, num_folds=3)
    assert isinstance(pairs, LFWPairs) and pairs.num_folds == 3
    assert pairs.same.tolist() == SAME
    assert pairs.left.tolist() == [0, 2, 4, 6, 8, 10]
    assert pairs.right.tolist() == [1, 3, 5, 7, 9, 11]
    assert pairs.fold.tolist() == [0, 0, 1, 1, 2, 2]
    assert len(pairs.images) == 12
    for i, array in enumerate(faces):
        image, label = pairs.images[i]
        assert torch.equal(image, uint8_to_tensor(array))  # PNG is lossless
    labels = pairs.images.labels
    assert (labels[pairs.left] == labels[pairs.right]).tolist() == SAME


def test_jpeg_resize_grey_and_registry(tmp_path, faces):
    path = write_bin(tmp_path / "cfp_fp.bin", ([encode(a, "JPEG") for a in faces], SAME))
    pairs = create_dataset("lfw_bin", path=path, image_size=16, mode="L", num_folds=2)
    image, _ = pairs.images[3]
    assert image.shape == (1, 16, 16) and 0.0 <= image.min() <= image.max() <= 1.0
    assert pairs.fold.tolist() == [0, 0, 0, 1, 1, 1]


def test_verification_accuracy_runs_on_the_pairs(lfw_bin):
    pairs = load_verification_bin(lfw_bin, num_folds=3)
    features = torch.stack([pairs.images[i][0].flatten() for i in range(len(pairs.images))])
    rows = np.stack([pairs.left, pairs.right, pairs.same.astype(np.int64)], axis=1)
    # matched pairs hold the same image (distance 0), mismatched ones random images
    assert verification_accuracy(features, features, rows, folds=pairs.fold) == 1.0


def test_python2_pickle_of_str_images_reads_as_bytes(tmp_path, faces):
    """Hand-written protocol-2 stream as Python 2 writes it: images are BINSTRING (py2 ``str``)."""
    images = [encode(a) for a in faces[:4]]
    stream = b"\x80\x02]("  # PROTO 2, EMPTY_LIST, MARK
    stream += b"".join(b"T" + struct.pack("<i", len(d)) + d for d in images)
    stream += b"e](\x88\x89e\x86."  # APPENDS, EMPTY_LIST, MARK, True, False, APPENDS, TUPLE2, STOP
    (tmp_path / "agedb_30.bin").write_bytes(stream)
    got, same = read_verification_bin(tmp_path / "agedb_30.bin")
    assert got == images and same.tolist() == [True, False]


def test_helpers_fold_sizes_and_pair_labels():
    assert consecutive_folds(7, 3).tolist() == [0, 0, 0, 1, 1, 2, 2]  # sklearn KFold sizes 3, 2, 2
    assert pair_labels(np.array([True, False, True])).tolist() == [0, 0, 1, 2, 3, 3]
    with pytest.raises(ValueError, match="num_folds"):
        consecutive_folds(3, 10)


# ---------------------------------------------------------------- hostile pickles
class _Reduce:
    """Pickles as ``callable(*args)``: what an attacker's file would contain."""

    def __init__(self, callable_, *args):
        self.callable, self.args = callable_, args

    def __reduce__(self):
        return self.callable, self.args


def _touch(marker) -> str:
    return f"open({str(marker)!r}, 'w').close()"


BUILTINS = "(builtins|__builtin__)"  # protocols < 3 write Python 2's name


@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize(
    ("make", "global_name"),
    [
        (lambda m: _Reduce(os.system, f"touch {m}"), f"{os.system.__module__}.system"),
        (lambda m: _Reduce(builtins.eval, _touch(m)), f"{BUILTINS}.eval"),
        (lambda m: _Reduce(builtins.exec, _touch(m)), f"{BUILTINS}.exec"),
        (lambda m: collections.OrderedDict(a=1), "collections.OrderedDict"),
    ],
    ids=["os.system", "builtins.eval", "builtins.exec", "OrderedDict"],
)
def test_hostile_pickle_refused_without_running_it(tmp_path, make, global_name, protocol):
    marker = tmp_path / "pwned"
    # no bytes before the payload: under protocol 0 bytes themselves need a global (see below)
    path = write_bin(tmp_path / "lfw.bin", ([make(marker)], [True]), protocol)
    refused = rf"lfw\.bin: pickle refers to global '{global_name}'"
    with pytest.raises(UnsafePickleError, match=refused):
        read_verification_bin(path)
    assert not marker.exists()


def test_hostile_pickle_is_live_with_plain_pickle(tmp_path):
    """Guards the test above: the same file does run its payload through ``pickle.load``."""
    marker = tmp_path / "pwned"
    payload = _Reduce(builtins.exec, _touch(marker))
    path = write_bin(tmp_path / "lfw.bin", ([payload], [True]))
    with open(path, "rb") as handle:
        pickle.load(handle)
    assert marker.exists()


def test_named_module_is_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_bin_module.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "lfw.bin").write_bytes(b"cevil_bin_module\nanything\n.")  # GLOBAL, STOP
    with pytest.raises(UnsafePickleError, match="evil_bin_module.anything"):
        read_verification_bin(tmp_path / "lfw.bin")
    assert not marker.exists() and "evil_bin_module" not in sys.modules


def test_persistent_id_refused(tmp_path):
    (tmp_path / "lfw.bin").write_bytes(b"Pany-id\n.")  # PERSID, STOP
    with pytest.raises(UnsafePickleError, match=r"lfw\.bin: pickle uses a persistent id"):
        read_verification_bin(tmp_path / "lfw.bin")


def test_numpy_bools_and_py3_protocol2_bytes_are_refused(tmp_path):
    """Both need a global (numpy scalars; ``_codecs.encode`` for bytes under protocol <= 2)."""
    path = write_bin(tmp_path / "lfw.bin", ([b"a", b"b"], [np.bool_(True)]))
    with pytest.raises(UnsafePickleError, match="numpy"):
        read_verification_bin(path)
    path = write_bin(tmp_path / "lfw.bin", ([b"a", b"b"], [True]), protocol=2)
    with pytest.raises(UnsafePickleError, match="_codecs.encode"):
        read_verification_bin(path)


# ---------------------------------------------------------------- malformed files
@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (([b"a", b"b"], [True], [1]), rf"{PAIR}, found tuple of 3 items"),
        ({"bins": [b"a", b"b"]}, rf"{PAIR}, found dict"),
        (([b"a", "b"], [True]), r"bins\[1\] is str, expected bytes"),
        (([b"a", b""], [True]), r"bins\[1\] is empty"),
        (([b"a", b"b", b"c"], [True]), r"3 images for 1 pairs; expected 2 per pair"),
        (([b"a", b"b", b"c", b"d"], [True, 1]), r"issame_list\[1\] is int 1, expected a bool"),
        (([b"a", b"b"], "yes"), r"issame_list must be a list, found str"),
        (([], []), r"holds no pairs"),
    ],
    ids=["3-tuple", "dict", "str-image", "empty-image", "length", "int-label", "str-labels",
         "no-pairs"],
)
def test_wrong_structure_refused_naming_the_file(tmp_path, payload, message):
    path = write_bin(tmp_path / "lfw.bin", payload)
    with pytest.raises(CorruptDataError, match=rf"lfw\.bin: {message}"):
        read_verification_bin(path)


def test_truncated_trailing_empty_and_missing_files(lfw_bin):
    data = lfw_bin.read_bytes()
    lfw_bin.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptDataError, match=r"lfw\.bin: not a complete pickle \(truncated"):
        read_verification_bin(lfw_bin)
    lfw_bin.write_bytes(b"")
    with pytest.raises(CorruptDataError, match=r"lfw\.bin: not a complete pickle"):
        read_verification_bin(lfw_bin)
    lfw_bin.write_bytes(data + b"junk")
    with pytest.raises(CorruptDataError, match=r"lfw\.bin: unexpected bytes after the end"):
        read_verification_bin(lfw_bin)
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        read_verification_bin(lfw_bin.parent / "missing.bin")


def test_undecodable_image_names_file_and_index(tmp_path, faces):
    good = encode(faces[0])
    path = write_bin(tmp_path / "lfw.bin", ([good, good, good, b"not an image"], [True, False]))
    pairs = load_verification_bin(path, num_folds=2)  # images are decoded on access
    assert pairs.images[2][0].shape == (3, 8, 6)
    with pytest.raises(CorruptDataError, match=r"cannot decode image .*lfw\.bin bins\[3\]"):
        pairs.images[3]
