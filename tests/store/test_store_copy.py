"""A store can be copied or synced and still work (issue 23, item 6): no record names the
store's root, so the copy lists, loads its models and searches its index after the original is
gone (``raycompat/store/relative.py``, ``catalog/models.py``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest

from raycompat.cli.app import main
from raycompat.index.version_index import build_version_index, open_search_index
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

ROWS, WIDTH = 40, 4
pytestmark = pytest.mark.usefixtures("one_faiss_thread")


MODEL_FILES = {"model.safetensors": b"\x00weights\x01", "model.json": b'{"model": {}}'}


def make_store(store: GalleryStore, model_dir: Path) -> None:
    """g/v1 (40 unit rows) with a flat index; model m1's files in the store, registered and
    granted the version."""
    x = np.random.default_rng(0).normal(size=(ROWS, WIDTH)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    staging = store.begin("g", VersionInfo("v1", "m1", WIDTH, True, "v1 = extract(m1)"))
    staging.write_table(embedding_table([f"r{i}" for i in range(ROWS)], x), "part-0.parquet")
    staging.commit(expected_rows=ROWS)
    model_dir.mkdir(exist_ok=True)
    for name, data in MODEL_FILES.items():
        (model_dir / name).write_bytes(data)
    catalog = Catalog(store)
    uri = catalog.put_model_files("m1", str(model_dir))  # an absolute URI into the store
    catalog.register_model(ModelRecord("m1", uri, WIDTH, method="independent"))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted"))
    build_version_index(store, "g", "v1", use_gpu=False)


def records(store: GalleryStore) -> dict[str, str]:
    """Every JSON file of the store, by path, as text."""
    fs = store.filesystem
    infos = fs.get_file_info(pafs.FileSelector(store.path(), recursive=True))
    out = {}
    for info in infos:
        if info.type == pafs.FileType.File and info.path.endswith(".json"):
            with fs.open_input_stream(info.path) as handle:
                out[info.path] = handle.read().decode()
    return out


def test_no_record_names_the_store_root(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    make_store(store, tmp_path / "m1")
    found = records(store)
    assert any(p.endswith("_models/m1.json") for p in found)
    assert [p for p, text in found.items() if str(tmp_path) in text] == []


def test_a_copied_store_works_after_the_original_is_deleted(tmp_path, capsys):
    original, copy = tmp_path / "store", tmp_path / "moved" / "store"
    make_store(GalleryStore(str(original)), tmp_path / "m1")
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    assert main(["versions", "g", "--store", str(copy), "--json"]) == 0
    assert [v["version"] for v in json.loads(capsys.readouterr().out)["versions"]] == ["v1"]
    assert main(["models", "--store", str(copy), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"][0]["uri"] == "_models/m1"
    catalog = Catalog(GalleryStore(str(copy)))
    assert catalog.model_uri("m1") == str(copy / "_models" / "m1")
    fetched = Path(catalog.fetch_model_files("m1", str(tmp_path / "fetched")))
    assert {p.name: p.read_bytes() for p in fetched.iterdir()} == MODEL_FILES
    argv = ["search", "g", "--ids", "r7", "-k", "3", "--model", "m1"]
    assert main([*argv, "--store", str(copy), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["results"][0]["ids"][0] == "r7"
    assert "exactly" not in err  # the copied index was loaded and verified, not bypassed


def test_a_store_copied_to_another_s3_prefix_works(s3_bucket, tmp_path):
    bucket, options = s3_bucket
    make_store(GalleryStore(f"s3://{bucket}/a", options), tmp_path / "m1")
    fs = GalleryStore(f"s3://{bucket}/a", options).filesystem
    pafs.copy_files(f"{bucket}/a", f"{bucket}/b", source_filesystem=fs, destination_filesystem=fs)
    fs.delete_dir(f"{bucket}/a")
    moved = GalleryStore(f"s3://{bucket}/b", options)
    catalog = Catalog(moved)
    assert catalog.model_uri("m1") == f"s3://{bucket}/b/_models/m1"
    fetched = Path(catalog.fetch_model_files("m1", str(tmp_path / "fetched")))
    assert {p.name: p.read_bytes() for p in fetched.iterdir()} == MODEL_FILES
    index, note = open_search_index(moved, "g", "v1", use_gpu=False)
    assert note is None and index.hits(index.index.index.reconstruct(3)[None], 1)[0][1][0] == "r3"
