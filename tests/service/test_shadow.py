"""Shadow traffic (issue 42, item 4): a candidate version searched in the background with the
served queries, overlap@k and negative flips counted, the answer untouched.

Gallery s holds four labelled items (ids 0-3: labels A, A, B, B) in v1 and v2 of model m1
(l2, 2-d). v2 moves item 1 far away and item 3 next to item 0, so, queried by its own stored
row from v1 (``ids``), item 0's nearest other item is 1 (A, right) in v1 and 3 (B, wrong) in
v2: a negative flip, overlap@2 = 1/2; item 2's is 3 (B) in both: overlap@2 = 1, no flip."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.errors import ConfigError
from raycompat.service.app import answer
from raycompat.service.config import ServiceConfig
from raycompat.service.requests import SearchRequest
from raycompat.service.served import Served
from raycompat.service.shadow import Shadow, ShadowSpec
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

V1 = [[0, 0], [0.1, 0], [5, 5], [5.1, 5]]
V2 = [[0, 0], [-6, -6], [5, 5], [0.1, 0]]
NAMES = ("s", "m1", "v2")


@pytest.fixture
def store(tmp_path) -> GalleryStore:
    store = GalleryStore(str(tmp_path / "store"))
    for version, rows in (("v1", V1), ("v2", V2)):
        staging = store.begin("s", VersionInfo(version, "m1", 2, False, f"{version} = x"))
        table = embedding_table(np.arange(4), np.array(rows, np.float32), labels=[0, 0, 1, 1])
        staging.write_table(table, "p.parquet")
        staging.commit(expected_rows=4)
    Catalog(store).register_model(ModelRecord("m1", "", 2, "independent"))
    Catalog(store).grant(QueryGrant("s", "v1", "m1", "extracted"))
    return store


def value(metric, *labels) -> float:
    return metric.labels(*labels)._value.get()


def test_overlap_and_negative_flips_are_counted_and_the_answer_is_the_served_one(store):
    served = Served(store)
    served.refresh()
    shadow = Shadow(store, [ShadowSpec.parse("s/m1=v2")], served.metrics)
    got = answer(served, SearchRequest("s", "m1", 2, None, ["0", "2"]), ServiceConfig(), shadow)
    shadow.flush()
    assert got["version"] == "v1" and [h["id"] for h in got["hits"][0]] == [0, 1]
    metrics = served.metrics
    overlap = metrics.shadow_overlap.labels(*NAMES)
    assert (overlap._sum.get(), sum(b.get() for b in overlap._buckets)) == (1.5, 2)
    assert (value(metrics.shadow_labelled, *NAMES), value(metrics.shadow_flips, *NAMES)) == (2, 1)
    shadow.close()


def test_vectors_are_compared_without_flips_and_the_served_version_is_not_shadowed(store):
    served = Served(store)
    served.refresh()
    shadow = Shadow(
        store, [ShadowSpec("s", "m1", "v2"), ShadowSpec("s", "m9", "v1")], served.metrics
    )
    vectors = np.array([[0, 0]], np.float32)
    answer(served, SearchRequest("s", "m1", 2, vectors, None), ServiceConfig(), shadow)
    shadow.flush()
    assert value(served.metrics.shadow_labelled, *NAMES) == 0  # no label for a vector
    assert served.metrics.shadow_overlap.labels(*NAMES)._sum.get() == 0.5
    same = Shadow(store, [ShadowSpec("s", "m1", "v1")], served.metrics)
    answer(served, SearchRequest("s", "m1", 2, vectors, None), ServiceConfig(), same)
    same.flush()
    assert served.metrics.shadow_overlap.labels("s", "m1", "v1")._sum.get() == 0
    shadow.close()
    same.close()


@pytest.mark.parametrize("text", ["s/m1", "s=v2", "/m1=v2", "s/m1/x=v2"])
def test_a_malformed_shadow_names_the_form(text):
    with pytest.raises(ConfigError, match="expected GALLERY/MODEL=VERSION"):
        ShadowSpec.parse(text)
