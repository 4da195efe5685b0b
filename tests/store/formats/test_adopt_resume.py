"""`raycompat adopt` killed after its version record: a rerun completes it (issue 22, item 4).

The kill is simulated by running the publish step alone (``publish_version``: the record and
nothing else) on files scanned without Ray; the full ``adopt_version`` then runs again. A rerun
of the same adoption needs no scan, so none of these tests starts Ray. Real Parquet files on
local disk and on the moto S3 server.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

import raycompat.cluster.pipelines.adopt as adopt_pipeline
from raycompat.errors import PublishConflictError
from raycompat.store import GalleryStore, SchemaError, StoreError, embedding_table
from raycompat.store.catalog.models import Catalog, CatalogConflictError, ModelRecord, QueryGrant
from raycompat.store.formats.adopt import plan_adoption, publish_version, summarize
from raycompat.store.formats.adopt_scan import scan_file


@pytest.fixture(params=["local", "s3"])
def table(request, tmp_path):
    """``(store, uri, write)``: an empty store and where its table goes; ``write(k, seed)``
    writes ``part-<k>.parquet`` (10 rows, 4-d) there."""
    if request.param == "local":
        store, uri = GalleryStore(str(tmp_path / "store")), str(tmp_path / "table")
        os.makedirs(uri)

        def write(k: int, seed: int = 0) -> None:
            pq.write_table(_rows(k, seed), f"{uri}/part-{k}.parquet")

        return store, uri, write
    import s3fs

    bucket, options = request.getfixturevalue("s3_bucket")
    fs = s3fs.S3FileSystem(**options)
    uri = f"s3://{bucket}/tables/faces"

    def write_s3(k: int, seed: int = 0) -> None:
        with fs.open(f"{bucket}/tables/faces/part-{k}.parquet", "wb") as handle:
            pq.write_table(_rows(k, seed), handle)

    return GalleryStore(f"s3://{bucket}/store", options), uri, write_s3


def _rows(k: int, seed: int):
    x = np.random.default_rng(seed + 10 * k).normal(size=(10, 4)).astype(np.float32)
    return embedding_table(np.arange(10 * k, 10 * k + 10), x)


def _killed_after_record(store, uri, model="ext"):
    """What a run killed between the version record and the model record leaves."""
    plan = plan_adoption(store, "faces", "v1", uri, model=model)
    info = summarize(plan, [scan_file(store, plan, rel) for rel in plan.files])
    return publish_version(store, plan, info)


def _adopt_again(store, uri, model="ext", **kwargs):
    return adopt_pipeline.adopt_version(store, "faces", "v1", uri, model=model, **kwargs)


def _record_bytes(store) -> bytes:
    with store.filesystem.open_input_stream(store.path("faces", "_versions", "v1.json")) as f:
        return f.read()


def test_a_rerun_completes_an_adoption_killed_after_its_record(table, monkeypatch):
    store, uri, write = table
    write(0), write(1)
    published = _killed_after_record(store, uri)
    catalog = Catalog(store)
    with pytest.raises(StoreError, match="not registered"):
        catalog.model("ext")
    record = _record_bytes(store)
    monkeypatch.setattr(adopt_pipeline, "_scan_files", None)  # a rerun must not scan again

    info = _adopt_again(store, uri)

    assert info.to_json() == published.to_json() and _record_bytes(store) == record
    assert catalog.model("ext").embed_dim == 4
    grant = catalog.queryable_version("faces", "ext")
    assert (grant.gallery_version, grant.relation) == ("v1", "extracted")
    assert _adopt_again(store, uri).to_json() == published.to_json()  # complete: a no-op
    assert catalog.queryable_version("faces", "ext").created == grant.created
    assert store.read("faces", "v1").num_rows == 20


def test_a_rerun_of_another_adoption_is_refused_naming_what_differs(table):
    store, uri, write = table
    write(0), write(1)
    _killed_after_record(store, uri)

    conflict = "already has version 'v1', which is not this adoption .model 'ext', now 'b'"
    with pytest.raises(PublishConflictError, match=conflict):
        _adopt_again(store, uri, model="b")
    write(1, seed=7)  # the same name, other content: its pin (bytes, ETag or mtime) differs
    pins = "etag" if uri.startswith("s3://") else "mtime_ns"
    with pytest.raises(PublishConflictError, match=rf"part-1\.parquet {pins} .*, now "):
        _adopt_again(store, uri)
    write(2)
    with pytest.raises(PublishConflictError, match=r"files: 2 pinned, 3 now .*'part-2\.parquet'"):
        _adopt_again(store, uri)
    with pytest.raises(StoreError, match="not registered"):
        Catalog(store).model("b")  # nothing written by a refused rerun


def test_a_model_or_grant_of_other_content_is_a_one_line_conflict(tmp_path):
    store, table = GalleryStore(str(tmp_path / "store")), str(tmp_path / "t")
    os.makedirs(table)
    pq.write_table(_rows(0, 0), f"{table}/part-0.parquet")
    _killed_after_record(store, table)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("ext", "", 4, method="external"))
    catalog.grant(QueryGrant("faces", "v1", "ext", "compatible", {"adopted_from": "elsewhere"}))

    with pytest.raises(CatalogConflictError) as conflict:
        _adopt_again(store, table)
    message = str(conflict.value)
    assert "\n" not in message and "query grant of 'ext' on 'faces'" in message
    assert "relation 'compatible', now 'extracted'" in message
    assert "evidence {'adopted_from': 'elsewhere'}, now {'adopted_from': " in message

    wide = GalleryStore(str(tmp_path / "wide"))
    Catalog(wide).register_model(ModelRecord("ext", "", 8, method="external"))
    _killed_after_record(wide, table)
    with pytest.raises(SchemaError, match="model 'ext' embeds to 8-d but the table holds 4-d"):
        _adopt_again(wide, table)
