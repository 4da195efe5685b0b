"""``raycompat adapt``: a query-side map fitted on paired rows, stored beside the version and
granted (``serving/adapt.py``, ``serving/query_adapters.py``), then applied by ``search`` to the new
model's queries; the gallery is never rewritten (issue 41, item 2's query side)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from raycompat.serving.query_adapters import load_adapter
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.store.read.vectors import vectors
from tests.cli.test_promotion import run

OLD, NEW, ROWS = 8, 6, 200  # the new model embeds to 6-d; the gallery holds 8-d rows


@pytest.fixture
def world(tmp_path):
    """Gallery g/v1 of m1's 8-d rows (ids 0..199); m9, a new 6-d model whose embedding of each
    item is an exact linear image of m1's (so a map from m9's space back is exact); its
    embeddings of the first 120 items as the pairs file; a query of m9 for item 150."""
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.standard_normal((OLD, OLD)))
    latent = rng.standard_normal((ROWS, NEW)).astype(np.float32)
    old = (latent @ basis[:NEW]).astype(np.float32)  # 8-d rows in a 6-d subspace
    new = latent  # m9's embedding: the subspace's coordinates
    store = GalleryStore(str(tmp_path / "store"))
    staging = store.begin("g", VersionInfo("v1", "m1", OLD, False, "v1"), "init")
    staging.write_table(embedding_table(np.arange(ROWS), old), "in.parquet")
    staging.commit(expected_rows=ROWS)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", "", OLD, "independent"))
    catalog.register_model(ModelRecord("m9", "", NEW, "independent"))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted"))
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(embedding_table(np.arange(120), new[:120]), pairs)
    query = tmp_path / "q.npy"
    np.save(query, new[150:151])
    return store, str(pairs), str(query), old


def adapt(capsys, store, pairs: str, *extra: str):
    return run(capsys, "adapt", "g", "--version", "v1", "--model", "m9", "--pairs", pairs,
               "--store", store.root, *extra)  # fmt: skip


@pytest.mark.parametrize("kind", ["procrustes", "affine"])
def test_an_adapted_model_finds_the_item_its_query_embeds(world, capsys, kind):
    store, pairs, query, _ = world
    code, out, err = run(capsys, "search", "g", "--model", "m9", "--vectors", query,
                         "--store", store.root)  # fmt: skip
    assert code == 1 and "m9" in err  # no grant yet: m9 may not search g
    code, out, err = adapt(capsys, store, pairs, "--kind", kind)
    assert code == 0, err
    assert out.startswith(f"m9 searches g/v1 through a {kind} query adapter fitted on 120 pairs")
    code, out, err = run(capsys, "search", "g", "--model", "m9", "--vectors", query,
                         "--store", store.root, "-k", "1", "--json")  # fmt: skip
    found = json.loads(out)
    assert code == 0 and found["relation"] == "adapted", err
    assert found["results"][0]["ids"] == [150]  # an item the fit never saw
    assert [v.version for v in store.versions("g")] == ["v1"]  # nothing rewritten


def test_a_rerun_is_a_no_op_and_the_adapter_is_checked_when_loaded(world, capsys):
    store, pairs, _, _ = world
    assert adapt(capsys, store, pairs)[0] == 0
    grant = Catalog(store).queryable_version("g", "m9")
    assert adapt(capsys, store, pairs)[0] == 0  # the same fit again: same files, same grant
    assert Catalog(store).queryable_version("g", "m9") == grant
    assert load_adapter(store, grant).kind == "procrustes"
    weights = store.path("g", grant.evidence["adapter"], "h.safetensors")
    with open(weights, "r+b") as handle:  # corrupt it on disk
        handle.seek(-4, 2)
        handle.write(b"\0\0\0\1")
    with pytest.raises(Exception, match="checksum mismatch with its query grant"):
        load_adapter(store, grant)


@pytest.mark.parametrize(
    "change, status, message",
    [
        ("unknown id", 2, "1 of 120 ids are not in g/v1 (first: 999)"),
        ("nan", 2, "NaN or inf in row 3"),
        ("width", 2, "expected finite (N, 6) embeddings, got shape (120, 5)"),
    ],
)
def test_bad_pairs_are_one_line_naming_the_file_and_write_nothing(world, capsys, change, status,
                                                                  message):  # fmt: skip
    store, pairs, _, _ = world
    table = pq.read_table(pairs)
    ids, x = table.column("id").to_numpy().copy(), vectors(table, "embedding")
    if change == "unknown id":
        ids[5] = 999
    elif change == "nan":
        x[3, 0] = np.nan
    else:
        x = x[:, :5]
    pq.write_table(embedding_table(ids, x.astype(np.float32)), pairs)
    code, out, err = adapt(capsys, store, pairs)
    assert code == status and err.count("\n") == 1 and pairs in err and message in err, err
    assert not os.path.exists(store.path("g", "_adapters"))


def test_a_missing_pairs_file_is_named_missing(world, capsys, tmp_path):
    store, _, _, _ = world
    missing = str(tmp_path / "m9_sample.parquet")
    code, out, err = adapt(capsys, store, missing)
    assert (code, out) == (2, "")
    assert err == f"raycompat: error: --pairs {missing}: the file does not exist\n"
    assert not os.path.exists(store.path("g", "_adapters"))


def test_a_model_with_a_grant_keeps_it(world, capsys):
    store, pairs, _, _ = world
    Catalog(store).grant(QueryGrant("g", "v1", "m9", "compatible"))
    code, _, err = adapt(capsys, store, pairs)
    assert code == 1 and err.count("\n") == 1 and "m9 already queries g at v1 (compatible)" in err
    assert Catalog(store).queryable_version("g", "m9").relation == "compatible"
    assert not os.path.exists(store.path("g", "_adapters"))  # nothing of the fit written


def test_a_named_alias_may_point_at_the_adapted_pair(world, capsys):
    store, pairs, query, _ = world
    assert adapt(capsys, store, pairs)[0] == 0
    code, out, err = run(capsys, "alias", "set", "g", "prod", "--version", "v1", "--model", "m9",
                         "--store", store.root)  # fmt: skip
    assert code == 0 and "m9's grant (adapted)" in out, err
    code, out, err = run(capsys, "search", "g", "--alias", "prod", "--vectors", query,
                         "--store", store.root, "-k", "1", "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["results"][0]["ids"] == [150], err


@pytest.mark.ray
def test_the_join_on_ray_fits_the_same_adapter_as_the_join_here(world, capsys, ray_local):
    """``--runner ray`` joins the pairs to v1's rows in Ray tasks (the session's Ray, as
    ``--address`` would name one): the same pairs, so the same stored map and grant."""
    store, pairs, _, _ = world
    code, out, err = adapt(capsys, store, pairs, "--runner", "ray", "--json")
    assert code == 0, err
    on_ray = json.loads(out)
    grant = Catalog(store).queryable_version("g", "m9")
    assert on_ray["pairs"] == 120 and grant.evidence["adapter"] == on_ray["adapter"]
    assert adapt(capsys, store, pairs)[0] == 0  # here: the same fit, so nothing new written
    assert Catalog(store).queryable_version("g", "m9") == grant
