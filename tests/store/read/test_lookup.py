"""Names that name nothing list what exists and the nearest (``raycompat/store/read/lookup.py``); a
record that exists but is unreadable stays a data error."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.errors import CorruptFileError, DataError, NotInStoreError, UsageError
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord
from raycompat.store.read.lookup import (
    check_gallery,
    choices,
    model_record,
    unknown_name,
    version_record,
)


@pytest.fixture
def store(tmp_path):
    store = GalleryStore(str(tmp_path / "store"))
    staging = store.begin("mnist", VersionInfo("v1", "m1", 2, False, "v1 = extract(m1)"), "t")
    staging.write_table(embedding_table(["a", "b"], np.eye(2, dtype=np.float32)), "p.parquet")
    staging.commit(expected_rows=2)
    Catalog(store).register_model(ModelRecord("resnet50_v1", str(tmp_path / "m"), 2))
    return store


def test_choices_names_the_nearest_only_when_it_is_close():
    assert choices("mnst", ["cifar", "mnist"], "galleries") == (
        "galleries are cifar, mnist; did you mean 'mnist'?"
    )
    assert choices("faces", ["cifar", "mnist"], "galleries") == "galleries are cifar, mnist"
    assert choices("x", [], "galleries") == "galleries are (none)"
    error = unknown_name("no gallery 'x'", "x", [], "galleries")
    # exit 1, as versions/search lookups always were (a store error, not a usage error)
    assert isinstance(error, NotInStoreError) and isinstance(error, DataError)
    assert not isinstance(error, UsageError)


def test_unknown_gallery_model_and_version_are_store_errors_naming_the_nearest(store):
    with pytest.raises(NotInStoreError, match=r"galleries are mnist; did you mean 'mnist'\?$"):
        check_gallery(store, "mnst")
    with pytest.raises(NotInStoreError, match=r"models are resnet50_v1; did you mean"):
        model_record(Catalog(store), "resnet50_v2")
    with pytest.raises(NotInStoreError, match=r"has no version 'v01': its versions are v1; did"):
        version_record(store, "mnist", "v01")
    assert version_record(store, "mnist", "v1").rows == 2
    assert model_record(Catalog(store), "resnet50_v1").embed_dim == 2


def test_an_unreadable_record_stays_a_data_error(store):
    path = store.path("_models", "resnet50_v1.json")
    with open(path, "w") as handle:
        handle.write("{not json")
    with pytest.raises(CorruptFileError) as raised:
        model_record(Catalog(store), "resnet50_v1")
    assert isinstance(raised.value, DataError) and not isinstance(raised.value, UsageError)
