"""The one I/O resolver (raycompat/io/uri.py): local paths and S3 (moto server), the same
``storage_options`` for the store, training runs and weights, credentials scrubbed on the way."""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import pytest

from raycompat.config.train import RunSpec
from raycompat.errors import StoreError
from raycompat.io import credentials
from raycompat.io.credentials import REDACTED, scrub
from raycompat.io.run_storage import read_json, run_filesystem, write_json
from raycompat.io.uri import filesystem, fsspec_filesystem, split_uri
from raycompat.store import GalleryStore


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test starts with no registered secret and leaves the process registry as it was."""
    monkeypatch.setattr(credentials, "_secrets", set())


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("s3://bucket/a/b/", ("s3", "bucket/a/b/")),
        ("file:///tmp/x", ("file", "/tmp/x")),
        ("relative/dir", ("file", "relative/dir")),
        ("/abs/dir", ("file", "/abs/dir")),
    ],
)
def test_split_uri(uri, expected):
    assert split_uri(uri) == expected


def test_local_paths_resolve_to_absolute_paths_and_ignore_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fs, path = filesystem("runs", {"client_kwargs": {"endpoint_url": "http://unused"}})
    assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path / "runs")
    assert filesystem(f"file://{tmp_path}/x")[1] == str(tmp_path / "x")


def test_unknown_scheme_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"unsupported scheme 'gs' in 'gs://b/p'"):
        filesystem("gs://b/p")
    with pytest.raises(ValueError, match=r"^run.storage_path: unsupported scheme 'gs'"):
        run_filesystem(RunSpec(storage_path="gs://b/p"))


def test_native_s3_takes_the_region_from_options_then_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-2")
    fs, path = filesystem("s3://bucket/prefix/")
    assert isinstance(fs, pafs.S3FileSystem) and fs.region == "eu-west-2"
    assert path == "bucket/prefix"
    options = {"client_kwargs": {"region_name": "ap-south-1"}}
    assert filesystem("s3://bucket", options)[0].region == "ap-south-1"


def test_untranslatable_options_fall_back_to_s3fs_unless_native_is_asked():
    options = {"config_kwargs": {"max_pool_connections": 4}}
    assert isinstance(filesystem("s3://bucket", options)[0], pafs.PyFileSystem)
    with pytest.raises(StoreError, match="config_kwargs"):
        filesystem("s3://bucket", options, bulk_io="native")
    with pytest.raises(StoreError, match="bulk_io must be"):
        filesystem("s3://bucket", {}, bulk_io="fast")


def test_credentials_are_registered_for_scrubbing_and_redacted_ones_dropped(monkeypatch):
    key, secret = "AKIARESOLVERKEY0001", "resolver/secret+value/0123"
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    filesystem("s3://bucket", {"key": key, "secret": secret})
    assert scrub(f"{key} {secret}") == f"{REDACTED} {REDACTED}"
    # A written config carries "<redacted>": dropped, so the environment's credentials are used.
    fs, _ = fsspec_filesystem("s3://bucket/w.pt", {"key": REDACTED, "secret": REDACTED})
    assert fs.key is None and fs.secret is None


def test_one_storage_options_setting_reaches_the_same_bucket_everywhere(s3_bucket):
    """A run's files, the store and weight files, all through the same s3fs options."""
    bucket, options = s3_bucket
    run = RunSpec(storage_path=f"s3://{bucket}/runs", storage_options=options)
    fs, base = run_filesystem(run)
    assert isinstance(fs, pafs.S3FileSystem) and base == f"{bucket}/runs"
    write_json(fs, f"{base}/r/state.json", {"steps": {}})

    store = GalleryStore(f"s3://{bucket}/runs", options)
    assert read_json(store.filesystem, f"{base}/r/state.json") == {"steps": {}}
    weights_fs, path = fsspec_filesystem(f"s3://{bucket}/runs/r/state.json", options)
    assert weights_fs.cat(path) == fs.open_input_stream(f"{base}/r/state.json").read()


def test_runs_without_options_read_credentials_from_the_environment(s3_bucket):
    bucket, options = s3_bucket
    assert os.environ["AWS_ACCESS_KEY_ID"]  # conftest's fake credentials, accepted by moto
    fs, base = filesystem(f"s3://{bucket}", options)
    write_json(fs, f"{base}/x.json", [1])
    assert read_json(fs, f"{base}/x.json") == [1]
    assert scrub(os.environ["AWS_SECRET_ACCESS_KEY"]) == REDACTED  # registered on the way


def test_the_native_client_takes_the_endpoint_from_the_environment_as_s3fs_does(
    s3_bucket, monkeypatch
):
    """pyarrow's S3 client does not read AWS_ENDPOINT_URL itself (it would ask AWS)."""
    bucket, options = s3_bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["client_kwargs"]["endpoint_url"])
    fs, base = filesystem(f"s3://{bucket}")  # no options
    assert isinstance(fs, pafs.S3FileSystem)
    write_json(fs, f"{base}/env.json", [2])
    assert read_json(GalleryStore(f"s3://{bucket}").filesystem, f"{base}/env.json") == [2]
