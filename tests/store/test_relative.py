"""Record paths relative to the store root (``raycompat/store/relative.py``; issue 23, item 6):
a model record names the store's own files as ``_models/<model>``, resolved against the root a
reader opened; paths outside the store and records of earlier releases load as before."""

from __future__ import annotations

import json

import pytest

from raycompat.errors import CorruptFileError
from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog, ModelRecord
from raycompat.store.relative import resolve, to_record


def test_paths_under_the_root_become_relative_and_resolve_back(tmp_path):
    root = str(tmp_path / "store")
    backend = GalleryStore(root).backend
    assert to_record(backend, f"{root}/_models/m1") == "_models/m1"
    assert to_record(backend, f"file://{root}/_models/m1/") == "_models/m1"
    assert to_record(backend, f"{root}/x/../_models/m1") == "_models/m1"
    for outside in (f"{root}-other/_models/m1", "/models/m1", "s3://b/store/_models/m1", ""):
        assert to_record(backend, outside) == outside
    assert resolve(backend, "_models/m1", "rec") == f"{root}/_models/m1"
    assert resolve(backend, "/models/m1", "rec") == "/models/m1"


def test_a_registered_model_records_its_store_files_relative(tmp_path):
    catalog = Catalog(GalleryStore(str(tmp_path / "store")))
    (tmp_path / "m1").mkdir()
    (tmp_path / "m1" / "model.json").write_text("{}")
    uri = catalog.put_model_files("m1", str(tmp_path / "m1"))
    catalog.register_model(ModelRecord("m1", uri, 4))
    catalog.register_model(ModelRecord("ext", str(tmp_path / "m1"), 4))  # outside: absolute
    stored = json.loads((tmp_path / "store" / "_models" / "m1.json").read_text())
    assert stored["uri"] == "_models/m1"
    assert catalog.model("ext").uri == str(tmp_path / "m1")
    assert catalog.model_uri("m1") == uri and catalog.model_uri("ext") == str(tmp_path / "m1")
    assert catalog.register_model(ModelRecord("m1", uri, 4)).uri == "_models/m1"  # a rerun


def test_a_record_of_an_earlier_release_with_an_absolute_uri_still_loads(tmp_path):
    """Written before relative paths: an absolute uri under the root reads as its relative
    form (so a rerun that registers the relative form is no conflict); one elsewhere is read
    as it is."""
    root = tmp_path / "store"
    catalog = Catalog(GalleryStore(str(root)))
    (root / "_models").mkdir(parents=True)
    for name, uri in (("old", f"{root}/_models/old"), ("moved", "/elsewhere/_models/moved")):
        record = {"model_version": name, "uri": uri, "embed_dim": 4, "created": "t"}
        (root / "_models" / f"{name}.json").write_text(json.dumps(record))
    assert catalog.model("old").uri == "_models/old"
    assert catalog.register_model(ModelRecord("old", f"{root}/_models/old", 4)).created == "t"
    assert catalog.model_uri("moved") == "/elsewhere/_models/moved"


def test_a_relative_uri_that_leaves_the_root_is_a_corrupt_record(tmp_path):
    root = tmp_path / "store"
    (root / "_models").mkdir(parents=True)
    record = {"model_version": "m1", "uri": "../../etc", "embed_dim": 4}
    (root / "_models" / "m1.json").write_text(json.dumps(record))
    with pytest.raises(
        CorruptFileError, match=r"m1\.json: model record key 'uri'.*'\.\./\.\./etc'"
    ):
        Catalog(GalleryStore(str(root))).model("m1")
