"""A transformation as files (raycompat/transformations/files.py): ``<name>.safetensors`` +
``<name>.json`` (kind and spec), read into memory from a local folder or S3 and rebuilt to the
bit; specs written before kinds were recorded read as FCT; an unknown kind is one line."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import s3fs
import torch

from raycompat.errors import DataError
from raycompat.transformations import (
    FCTTransformation,
    PairStatistics,
    Transformation,
    UnknownKindError,
    fit_adapter,
    fit_affine,
    fit_kind,
    fit_procrustes,
    load_transformation,
    read_transformation,
    read_transformation_spec,
    save_transformation,
    weights_path,
)


@pytest.fixture
def h_dir(tmp_path):
    torch.manual_seed(0)
    save_transformation(tmp_path / "fct", FCTTransformation(6, 3, 4, width=16), "h")
    return tmp_path / "fct"


def outputs(module: Transformation) -> torch.Tensor:
    torch.manual_seed(1)
    with torch.inference_mode():
        return module(torch.randn(5, 6), torch.randn(5, 3))


def rewrite_spec(directory, name: str, change) -> None:
    path = directory / f"{name}.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


@pytest.mark.parametrize("uncertainty", [False, True])
def test_save_load_round_trip_is_bit_identical(tmp_path, uncertainty):
    torch.manual_seed(0)
    h = FCTTransformation(6, 3, 4, width=16, normalize_output=True, uncertainty=uncertainty)
    h.train()
    h(torch.randn(32, 6), torch.randn(32, 3))  # BatchNorm running statistics move off 0 and 1
    h.eval()
    save_transformation(tmp_path, h, "h", epoch=7)
    info = json.loads((tmp_path / "h.json").read_text())
    assert info["kind"] == "fct" and info["epoch"] == 7 and info["uncertainty"] is uncertainty
    loaded = load_transformation(tmp_path)
    assert isinstance(loaded, FCTTransformation) and not loaded.training
    assert loaded.spec() == h.spec()
    torch.testing.assert_close(outputs(loaded), outputs(h), rtol=0, atol=0)
    if uncertainty:
        old, side = torch.randn(5, 6), torch.randn(5, 3)
        for got, expected in zip(
            loaded.forward_with_uncertainty(old, side),
            h.forward_with_uncertainty(old, side),
            strict=True,
        ):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_read_from_a_folder_builds_what_the_folder_holds(h_dir):
    files = read_transformation(h_dir, "h")
    assert files.spec.kind == "fct" and files.spec.d_old == 6
    assert files.spec.uncertainty is False and files.spec.args["width"] == 16
    assert files.digest == hashlib.sha256(weights_path(h_dir).read_bytes()).hexdigest()
    torch.testing.assert_close(outputs(files.build()), outputs(load_transformation(h_dir)))


def test_read_from_s3_builds_the_same_module(h_dir, s3_bucket):
    bucket, options = s3_bucket
    s3fs.S3FileSystem(**options).put(str(h_dir), f"{bucket}/models/fct", recursive=True)
    files = read_transformation(f"s3://{bucket}/models/fct", "h", options)
    torch.testing.assert_close(outputs(files.build()), outputs(load_transformation(h_dir)))


def test_a_spec_without_kind_or_uncertainty_loads_as_fct(h_dir):
    """Directories exported before kinds (and FastFill's flag) were recorded."""
    expected = outputs(load_transformation(h_dir))
    rewrite_spec(h_dir, "h", lambda info: (info.pop("kind"), info.pop("uncertainty")))
    spec = read_transformation_spec(h_dir)
    assert spec.kind == "fct" and spec.args["uncertainty"] is False
    loaded = load_transformation(h_dir)
    assert isinstance(loaded, FCTTransformation) and not loaded.has_uncertainty
    torch.testing.assert_close(outputs(loaded), expected, rtol=0, atol=0)


def test_an_unknown_stored_kind_is_one_line_naming_the_file(h_dir):
    rewrite_spec(h_dir, "h", lambda info: info.update(kind="procrustes-v9"))
    with pytest.raises(UnknownKindError) as err:
        read_transformation(h_dir)
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, DataError)
    assert message.startswith(f"{h_dir}/h.json: unknown transformation kind 'procrustes-v9'")
    assert message.endswith("this raycompat reads adapter, affine, fct, procrustes, slerp")
    with pytest.raises(UnknownKindError, match="procrustes-v9"):
        load_transformation(h_dir)


def test_a_spec_lacking_a_key_is_named(h_dir):
    rewrite_spec(h_dir, "h", lambda info: info.pop("width"))
    with pytest.raises(ValueError, match=r"h\.json: lacks \['width'\]"):
        read_transformation_spec(h_dir)


def test_a_missing_export_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"fct/g\.json does not exist: not an exported"):
        read_transformation(tmp_path / "fct", "g")


def fitted(kind: str):
    """A fitted transformation of ``kind`` (widths 6 -> 4) on small random pairs."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y = np.tanh(x[:, :4] + 0.5).astype(np.float32)
    fits = {
        "procrustes": lambda: fit_procrustes(PairStatistics.of(x, y), center=True),
        "affine": lambda: fit_affine(PairStatistics.of(x, y), 0.1, normalize_output=True),
        "adapter": lambda: fit_adapter(x, y, width=8, steps=10),
        "slerp": lambda: fit_kind("slerp", x, y),
    }
    return fits[kind]()


@pytest.mark.parametrize("kind", ["procrustes", "affine", "adapter", "slerp"])
def test_a_fitted_kind_round_trips_to_the_bit_with_its_digest(tmp_path, kind):
    fit = fitted(kind)
    save_transformation(tmp_path / "a", fit.transformation, "h", **fit.info())
    info = json.loads((tmp_path / "a" / "h.json").read_text())
    assert info["kind"] == kind and info["d_side"] == 0 and info["fit"]["pairs"] == 64
    files = read_transformation(tmp_path / "a")
    loaded = files.build()
    assert type(loaded) is type(fit.transformation) and loaded.spec() == fit.transformation.spec()
    old = torch.randn(5, 6)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(old), fit.transformation(old), rtol=0, atol=0)
    save_transformation(tmp_path / "b", loaded, "h")  # the loaded module, saved again
    assert read_transformation(tmp_path / "b").digest == files.digest
    assert files.digest == hashlib.sha256(weights_path(tmp_path / "a").read_bytes()).hexdigest()


def test_an_unknown_kind_in_a_fitted_kinds_file_is_one_line(tmp_path):
    save_transformation(tmp_path, fitted("procrustes").transformation, "h")
    rewrite_spec(tmp_path, "h", lambda info: info.update(kind="procrustes2"))
    with pytest.raises(UnknownKindError) as err:
        load_transformation(tmp_path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(
        f"{tmp_path}/h.json: unknown transformation kind 'procrustes2'"
    )
