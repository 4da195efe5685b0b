"""``h``/``g`` read into memory from a local folder or S3 rebuild the module the files hold,
so a pipeline's actors need no folder (raycompat/fct/models.py)."""

from __future__ import annotations

import hashlib

import pytest
import s3fs
import torch

from raycompat.fct.export import load_transformation
from raycompat.fct.models import read_transformation, save_transformation, weights_path
from raycompat.fct.transformation import FCTTransformation


@pytest.fixture
def h_dir(tmp_path):
    torch.manual_seed(0)
    save_transformation(tmp_path / "fct", FCTTransformation(6, 3, 4, width=16), "h")
    return tmp_path / "fct"


def outputs(module: FCTTransformation) -> torch.Tensor:
    torch.manual_seed(1)
    with torch.inference_mode():
        return module(torch.randn(5, 6), torch.randn(5, 3))


def test_read_from_a_folder_builds_what_the_folder_holds(h_dir):
    files = read_transformation(h_dir, "h")
    assert files.spec["d_old"] == 6 and files.spec["uncertainty"] is False
    assert files.digest == hashlib.sha256(weights_path(h_dir).read_bytes()).hexdigest()
    torch.testing.assert_close(outputs(files.build()), outputs(load_transformation(h_dir)))


def test_read_from_s3_builds_the_same_module(h_dir, s3_bucket):
    bucket, options = s3_bucket
    s3fs.S3FileSystem(**options).put(str(h_dir), f"{bucket}/models/fct", recursive=True)
    files = read_transformation(f"s3://{bucket}/models/fct", "h", options)
    torch.testing.assert_close(outputs(files.build()), outputs(load_transformation(h_dir)))


def test_a_missing_export_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"fct/g\.json does not exist: not an exported"):
        read_transformation(tmp_path / "fct", "g")
