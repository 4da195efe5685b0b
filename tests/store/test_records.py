"""Catalog records are schema-checked when read: version records, model records, query grants.

A bad record is a CorruptFileError naming the file and the key; listings report corrupt records
beside the readable ones; a store root that does not exist is told apart from an empty store.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from raycompat.errors import CorruptFileError, ManifestError, MissingStoreError
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

GOOD = {
    "format": "raycompat.store/1",
    "version": "v1",
    "model_version": "m1",
    "width": 4,
    "normalized": False,
    "lineage": "v1 = extract(m1)",
    "side_info_width": None,
    "rows": 3,
    "files": ["_data/v1/s/part-0.parquet"],
    "created": "2024-01-01T00:00:00+00:00",
    "ids": {"count": 3, "sum": "00000000000000ff", "xor": "000000000000000a"},
}


def publish(store: GalleryStore, gallery: str, version: str, model: str = "m1") -> None:
    info = VersionInfo(version, model, 4, False, f"{version} = extract({model})")
    staging = store.begin(gallery, info, staging_name="t")
    rows = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    staging.write_table(embedding_table(["a", "b", "c"], rows), "part-0.parquet")
    staging.commit(expected_rows=3)


@pytest.fixture
def catalog(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "faces", "v1")
    publish(store, "faces", "v2")
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", "/models/m1", 4, method="independent"))
    catalog.grant(QueryGrant("faces", "v1", "m1", "extracted"))
    return catalog


def test_a_good_record_parses():
    info = VersionInfo.from_json(json.dumps(GOOD).encode(), "g/_versions/v1.json")
    assert (info.rows, info.ids["count"]) == (3, 3)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("rows", "lots", "key 'rows' must be an int, got 'lots'"),
        ("rows", -1, "key 'rows' must be an int >= 0, got -1"),
        ("rows", True, "key 'rows' must be an int, got True"),
        ("width", 2.0, "key 'width' must be an int"),
        ("normalized", "yes", "key 'normalized' must be a bool"),
        ("created", 5, "key 'created' must be a string"),
        ("files", "_data/v1/p.parquet", "key 'files' must be a list of strings"),
        ("files", ["_data/v1/p.parquet", 3], "key 'files' must be a list of strings"),
        ("side_info_width", 0, "side_info_width must be a positive int"),
        ("ids", [1, 2], "key 'ids' must be an object or null"),
        ("ids", {"count": 3}, "key 'ids' must have the keys count, sum, xor"),
        ("ids", {"count": "3", "sum": "0", "xor": "0"}, "key 'ids.count' must be an int >= 0"),
        ("ids", {"count": 3, "sum": "xyz", "xor": "0"}, "key 'ids.sum' must be 1-16 hex digits"),
        ("colour", "red", "has unknown key(s) colour"),
    ],
)
def test_a_bad_version_record_names_the_file_and_the_key(key, value, message):
    data = json.dumps({**GOOD, key: value}).encode()
    with pytest.raises(CorruptFileError, match=r"^g/_versions/v1\.json: .*" + re.escape(message)):
        VersionInfo.from_json(data, "g/_versions/v1.json")


def test_a_record_missing_a_key_or_not_an_object_is_corrupt():
    raw = {k: v for k, v in GOOD.items() if k != "lineage"}
    with pytest.raises(CorruptFileError, match=r"v1\.json: version record lacks key\(s\) lineage"):
        VersionInfo.from_json(json.dumps(raw).encode(), "v1.json")
    with pytest.raises(CorruptFileError, match=r"v1\.json: version record is not a JSON object"):
        VersionInfo.from_json(b"[1, 2]", "v1.json")


def test_a_committed_record_carries_an_id_fingerprint_that_reads_back(catalog):
    info = catalog.store.version("faces", "v1")
    assert info.ids is not None and info.ids["count"] == info.rows == 3


def test_versions_is_strict_and_versions_report_lists_the_readable_ones(catalog):
    store = catalog.store
    record = store.path("faces", "_versions", "v1.json")
    raw = json.loads(open(record).read())
    open(record, "w").write(json.dumps({**raw, "rows": "lots"}))
    with pytest.raises(CorruptFileError, match=r"v1\.json: version record key 'rows'"):
        store.versions("faces")
    infos, corrupt = store.versions_report("faces")
    assert [i.version for i in infos] == ["v2"]
    ((uri, error),) = corrupt
    assert uri.endswith("faces/_versions/v1.json") and "key 'rows'" in error
    open(record, "w").write(json.dumps({**raw, "version": "v2"}))  # readable, but misfiled
    with pytest.raises(ManifestError, match="record is for version 'v2'"):
        store.versions("faces")
    assert [uri.rsplit("/", 1)[1] for uri, _ in store.versions_report("faces")[1]] == ["v1.json"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"embed_dim": "4"}, "model record key 'embed_dim' must be an int, got '4'"),
        ({"embed_dim": 0}, "model record key 'embed_dim' must be >= 1, got 0"),
        ({"parent": "../m0"}, "model record key 'parent': model name '../m0' is not allowed"),
        ({"model_version": "m7"}, "record key 'model_version' is 'm7', but its path names 'm1'"),
        ({"colour": "red"}, "model record has unknown key(s) colour"),
        ({"uri": None}, "model record key 'uri' must be a string, got None"),
    ],
)
def test_a_bad_model_record_names_the_file_and_the_key(catalog, change, message):
    path = catalog.store.path("_models", "m1.json")
    raw = json.loads(open(path).read())
    open(path, "w").write(json.dumps({**raw, **change}))
    pattern = r"_models/m1\.json: " + re.escape(message)
    with pytest.raises(CorruptFileError, match=pattern):
        catalog.model("m1")
    with pytest.raises(CorruptFileError, match=pattern):
        catalog.models()
    records, ((uri, error),) = catalog.models_report()
    assert records == [] and uri == catalog.store.uri("_models", "m1.json")
    assert error.startswith(f"{uri}: {message}")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"relation": "friends"}, "query grant key 'relation' must be one of extracted"),
        ({"evidence": [0.7]}, "query grant key 'evidence' must be an object, got [0.7]"),
        ({"gallery": "cars"}, "record key 'gallery' is 'cars', but its path names 'faces'"),
        ({"created": None}, "query grant key 'created' must be a string"),
    ],
)
def test_a_bad_query_grant_names_the_file_and_the_key(catalog, change, message):
    path = catalog.store.path("faces", "_queries", "m1.json")
    raw = json.loads(open(path).read())
    open(path, "w").write(json.dumps({**raw, **change}))
    pattern = r"faces/_queries/m1\.json: .*" + re.escape(message)
    with pytest.raises(CorruptFileError, match=pattern):
        catalog.queryable_version("faces", "m1")
    with pytest.raises(CorruptFileError, match=pattern):
        catalog.grants("faces")
    grants, corrupt = catalog.grants_report("faces")
    assert grants == [] and len(corrupt) == 1


def test_a_grant_that_is_not_json_is_corrupt(catalog):
    open(catalog.store.path("faces", "_queries", "m1.json"), "w").write("{half")
    with pytest.raises(CorruptFileError, match=r"m1\.json: query grant is not valid JSON"):
        catalog.grants("faces")


def test_a_missing_local_store_is_not_an_empty_one(tmp_path):
    store = GalleryStore(str(tmp_path / "typo"))  # constructing it writes and checks nothing
    assert not store.exists() and not (tmp_path / "typo").exists()
    with pytest.raises(MissingStoreError, match=r"no store at .*typo: the folder does not exist"):
        store.check_exists()
    publish(store, "faces", "v1")  # a job writing a new store
    assert store.exists()
    assert GalleryStore(str(tmp_path)).exists()  # an existing, empty folder is a store


def test_a_missing_s3_store_is_a_prefix_without_objects(s3_bucket):
    bucket, options = s3_bucket
    store = GalleryStore(f"s3://{bucket}/typo", options)
    assert not store.exists()
    with pytest.raises(MissingStoreError, match=rf"no store at s3://{bucket}/typo: no object"):
        store.check_exists()
    publish(store, "faces", "v1")
    assert store.exists()
    assert not GalleryStore(f"s3://{bucket}/ty", options).exists()  # a prefix of a key's name
