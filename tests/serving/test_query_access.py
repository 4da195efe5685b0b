"""``serving/query_access.py``: the model a transform job wrote a version for queries it (issue 40,
item 8: a gallery written by the transform job was not searchable, "model 'm1' is not
registered")."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.errors import SchemaError
from raycompat.serving.query_access import grant_written
from raycompat.serving.query_inputs import query_vectors
from raycompat.serving.query_path import search_gallery
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, NoWeightsError, QueryGrant
from raycompat.store.catalog.retired import retire


def publish(store: GalleryStore, version: str, model: str, width: int = 4) -> VersionInfo:
    x = np.eye(6, width, dtype=np.float32)
    staging = store.begin("g", VersionInfo(version, model, width, False, f"{version} = h(v1)"))
    staging.write_table(embedding_table(np.arange(6), x), "p.parquet")
    return staging.commit(expected_rows=6)


def test_a_transformed_version_is_granted_to_its_model_registered_without_weights(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    info = publish(store, "v2", "m2")
    line = grant_written(store, "g", info, "transformed")
    assert line == "model m2 queries g v2 (transformed, without weights: it queries with vectors)"
    catalog = Catalog(store)
    assert not catalog.model("m2").has_weights
    assert catalog.queryable_version("g", "m2").relation == "transformed"
    assert grant_written(store, "g", info, "transformed") == line  # a rerun: the same records
    queries = query_vectors(store, "g", "v2", "m2", ids=["3"])
    assert search_gallery(store, "g", queries, 1, model="m2").hits[0].ids.tolist() == [3]
    with pytest.raises(NoWeightsError, match="'m2' has no weights .* cannot embed query images"):
        query_vectors(store, "g", "v2", "m2", images=["digit.png"])


def test_an_extraction_copies_its_model_files_in(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    model_dir = tmp_path / "m1"
    model_dir.mkdir()
    for name in ("model.safetensors", "model.json", "test_features.npy"):
        (model_dir / name).write_bytes(name.encode())
    info = publish(store, "v1", "m1")
    files = ("model.safetensors", "model.json")
    line = grant_written(store, "g", info, "extracted", str(model_dir), files)
    assert line == "model m1 queries g v1 (extracted)"
    catalog = Catalog(store)
    assert catalog.model("m1").uri == "_models/m1"
    copied = tmp_path / "store" / "_models" / "m1"
    assert sorted(p.name for p in copied.iterdir()) == sorted(files)


def test_a_model_that_queries_another_version_keeps_it_and_the_line_says_how_to_search(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    catalog = Catalog(store)
    publish(store, "v1", "m1")
    catalog.register_model(ModelRecord("m1", "", 4, method="external"))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted"))
    v2 = publish(store, "v2", "m1")
    assert grant_written(store, "g", v2, "transformed") == (
        "model m1 is not granted g v2 (it queries v1); search the version with "
        "raycompat search g --version v2"
    )
    assert catalog.queryable_version("g", "m1").gallery_version == "v1"
    wide = publish(store, "v3", "m1", width=6)
    with pytest.raises(SchemaError, match="'m1' embeds to 4-d but g/v3 holds 6-d rows"):
        grant_written(store, "g", wide, "transformed")
    catalog.register_model(ModelRecord("m5", "", 4, method="external"))
    retire(store, "m5", "replaced")
    assert "(it is retired)" in grant_written(store, "g", publish(store, "v4", "m5"), "extracted")
