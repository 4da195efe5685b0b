"""The model catalog: immutable model records and query grants, locally and on S3."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from raycompat.errors import SchemaError, StoreError, UnsafePathError
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import (
    Catalog,
    CatalogConflictError,
    ModelRecord,
    NoWeightsError,
    QueryGrant,
)


def publish(store: GalleryStore, gallery: str, version: str, width: int, model: str) -> None:
    rows = np.random.default_rng(0).normal(size=(20, width)).astype(np.float32)
    info = VersionInfo(
        version,
        model_version=model,
        width=width,
        normalized=False,
        lineage=f"{version} = extract({model})",
    )
    staging = store.begin(gallery, info, staging_name="test")
    staging.write_table(embedding_table([f"id{i}" for i in range(20)], rows), "part-0.parquet")
    staging.commit(expected_rows=20)


@pytest.fixture
def catalog(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "faces", "v1", 8, "m1")
    return Catalog(store)


def test_models_and_grants_round_trip(catalog):
    m1 = catalog.register_model(ModelRecord("m1", "/models/m1", 8, method="cores"))
    catalog.register_model(ModelRecord("m2", "/models/m2", 8, method="cores", parent="m1"))
    assert [m.model_version for m in catalog.models()] == ["m1", "m2"]
    assert catalog.model("m1") == m1 and m1.created
    catalog.grant(QueryGrant("faces", "v1", "m1", "extracted"))
    catalog.grant(QueryGrant("faces", "v1", "m2", "compatible", {"cross": 0.7, "self": 0.6}))
    grant = catalog.queryable_version("faces", "m2")
    assert (grant.gallery_version, grant.relation, grant.evidence["cross"]) == (
        "v1",
        "compatible",
        0.7,
    )
    assert [g.model_version for g in catalog.grants("faces")] == ["m1", "m2"]
    assert catalog.store.galleries() == ["faces"]  # catalog folders are not galleries


def test_rerunning_an_upgrade_is_a_no_op_but_a_different_record_conflicts(catalog):
    first = catalog.register_model(ModelRecord("m1", "/models/m1", 8))
    again = catalog.register_model(ModelRecord("m1", "/models/m1", 8))
    assert again.created == first.created
    with pytest.raises(CatalogConflictError, match="m1.*already recorded"):
        catalog.register_model(ModelRecord("m1", "/models/other", 8))
    catalog.grant(QueryGrant("faces", "v1", "m1", "extracted"))
    catalog.grant(QueryGrant("faces", "v1", "m1", "extracted"))
    publish(catalog.store, "faces", "v2", 8, "m1")
    with pytest.raises(CatalogConflictError):
        catalog.grant(QueryGrant("faces", "v2", "m1", "extracted"))


def test_concurrent_registrations_of_different_content_have_one_winner(catalog):
    outcomes = []

    def register(uri):
        try:
            catalog.register_model(ModelRecord("race", uri, 8))
            outcomes.append("won")
        except CatalogConflictError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=register, args=(f"/models/{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict"] * 3 + ["won"]


def test_bad_grants_are_refused_with_the_reason(catalog):
    with pytest.raises(StoreError, match="'m9' is not registered"):
        catalog.grant(QueryGrant("faces", "v1", "m9", "extracted"))
    catalog.register_model(ModelRecord("wide", "/models/wide", 16))
    with pytest.raises(StoreError, match="8-d rows but model wide embeds to 16-d"):
        catalog.grant(QueryGrant("faces", "v1", "wide", "transformed"))
    with pytest.raises(ValueError, match="relation 'maybe'"):
        catalog.grant(QueryGrant("faces", "v1", "wide", "maybe"))
    with pytest.raises(StoreError):
        catalog.grant(QueryGrant("faces", "v7", "wide", "compatible"))  # no such version
    with pytest.raises(StoreError, match="may not query gallery 'faces'"):
        catalog.queryable_version("faces", "wide")
    with pytest.raises(StoreError, match="parent"):
        catalog.register_model(ModelRecord("orphan", "/m", 8, parent="missing"))


def test_a_model_registered_without_weights_says_so_when_its_files_are_asked(catalog, tmp_path):
    """Issue 40, item 1: an adopted model (no files) is a NoWeightsError naming what cannot be
    done, not "registered but has no files"; one with files is fetched as before."""
    catalog.register_model(ModelRecord("ext", "", 8, method="external"))
    (tmp_path / "m1").mkdir()
    (tmp_path / "m1" / "model.json").write_text("{}")
    catalog.register_model(
        ModelRecord("m1", catalog.put_model_files("m1", str(tmp_path / "m1")), 8)
    )
    assert [m.has_weights for m in catalog.models()] == [False, True]
    assert catalog.without_weights() == ["ext"]
    with pytest.raises(
        NoWeightsError,
        match=r"^model 'ext' has no weights in .*: it cannot be "
        r"trained against; it queries with vectors \(search --vectors or --ids\)$",
    ):
        catalog.fetch_model_files("ext", str(tmp_path / "out"), "be trained against")
    assert catalog.fetch_model_files("m1", str(tmp_path / "out")) == str(tmp_path / "out")
    assert not (tmp_path / "out" / "ext").exists()
    # the registered record wins over a new one of the same width; another width is refused
    assert catalog.registered_or(ModelRecord("m1", "", 8), "v2") == catalog.model("m1")
    assert catalog.registered_or(ModelRecord("m9", "", 4), "v2").model_version == "m9"
    with pytest.raises(SchemaError, match="'m1' embeds to 8-d but v2 holds 4-d rows"):
        catalog.registered_or(ModelRecord("m1", "", 4), "v2")


def test_names_cannot_escape_the_store(catalog):
    with pytest.raises(UnsafePathError):
        catalog.register_model(ModelRecord("../evil", "/m", 8))
    with pytest.raises(UnsafePathError):
        catalog.queryable_version("../faces", "m1")


def test_catalog_on_s3(s3_bucket):
    bucket, options = s3_bucket
    store = GalleryStore(f"s3://{bucket}/store", storage_options=options)
    publish(store, "faces", "v1", 8, "m1")
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", f"s3://{bucket}/models/m1", 8))
    catalog.grant(QueryGrant("faces", "v1", "m1", "extracted"))
    assert (
        Catalog(GalleryStore(f"s3://{bucket}/store", storage_options=options))
        .queryable_version("faces", "m1")
        .gallery_version
        == "v1"
    )
    with pytest.raises(CatalogConflictError):
        catalog.register_model(ModelRecord("m1", "elsewhere", 8))
