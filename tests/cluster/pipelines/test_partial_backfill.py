"""The partial backfill pipeline against single-process references: the k most uncertain rows
re-extracted and the rest h(old), budgets 0 and 1, the seeded random order, resume after a
failure half-way, raising the budget of a partial version, and the refusals before any work.

Gallery: 600 MNIST-5k digits; v1 holds LeNet++ m1's features (computed in process), the new
model m2 is another LeNet++, h a small FCT transformation with random weights and the
uncertainty head. 6 chunks of 100 rows, read in batches of 64.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from raycompat.backfill import backfill_order
from raycompat.cluster.pipelines import (
    PipelineError,
    RunOptions,
    SourceSpec,
    partial_backfill_version,
)
from raycompat.cluster.pipelines import backfill as backfill_module
from raycompat.cluster.pipelines import runner as runner_module
from raycompat.cluster.pipelines import selection as selection_module
from raycompat.cluster.pipelines.runner import run_chunks
from raycompat.cluster.pipelines.selection import Selection, Threshold, random_keys
from raycompat.config.train import ModelSpec
from raycompat.data import create_dataset
from raycompat.errors import ConfigError
from raycompat.store import GalleryStore, SchemaError, VersionInfo, embedding_table
from raycompat.store.commit.part_record import part_of_file
from raycompat.store.schema import validate_values
from raycompat.train.export import build_model, export_model, load_exported_model
from raycompat.transformations import FCTTransformation, load_transformation, save_transformation

D_OLD, D_NEW, ROWS = 8, 6, 600
IMAGES = SourceSpec(kind="dataset", name="mnist5k", options={"per_class": 60})
RUN = RunOptions(rows_per_file=100, batch_size=64, actors=2, progress_every_s=1)


def lenet(directory: Path, embed_dim: int, seed: int) -> str:
    spec = ModelSpec(
        backbone="lenetpp",
        head="linear",
        num_classes=10,
        embed_dim=embed_dim,
        backbone_kwargs={"in_chans": 1, "image_size": 28},
    )
    torch.manual_seed(seed)
    export_model(directory, build_model(spec).state_dict(), spec)
    return str(directory)


def random_h(directory: Path, uncertainty: bool) -> str:
    """h with random weights and BN statistics (so eval-mode BN is not the identity)."""
    torch.manual_seed(0)
    h = FCTTransformation(D_OLD, 0, D_NEW, width=32, normalize_output=True, uncertainty=True)
    if not uncertainty:
        h = FCTTransformation(D_OLD, 0, D_NEW, width=32, normalize_output=True)
    for m in h.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    save_transformation(directory, h, "h")
    return str(directory)


def features(model_dir: str, images: torch.Tensor) -> np.ndarray:
    model = load_exported_model(model_dir)[0]
    with torch.no_grad():
        return F.normalize(model.forward_features(images), dim=1).numpy()


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    """v1 = m1's features of 600 digits in 3 files of 50-row groups; references for h and m2."""
    tmp = tmp_path_factory.mktemp("partial_backfill")
    dataset = create_dataset(IMAGES.name, **IMAGES.options)
    images = dataset.batch(np.arange(len(dataset)))
    m1, m2 = lenet(tmp / "m1", D_OLD, 1), lenet(tmp / "m2", D_NEW, 2)
    old = features(m1, images)
    store = GalleryStore(str(tmp / "store"))
    staging = store.begin("g", VersionInfo("v1", "m1", D_OLD, True, "v1 = extract(m1)"), "init")
    for k, rows in enumerate(np.array_split(np.arange(ROWS), 3)):
        table = embedding_table(rows, old[rows], labels=dataset.labels[rows])
        staging.write_table(table, f"in-{k}.parquet", row_group_size=50)
    staging.commit(expected_rows=ROWS)
    h_dir = random_h(tmp / "h", uncertainty=True)
    with torch.no_grad():
        h_old, sigma = load_transformation(h_dir).forward_with_uncertainty(torch.tensor(old))
    return {
        "store": store,
        "m2": m2,
        "h": h_dir,
        "h_plain": random_h(tmp / "h_plain", uncertainty=False),
        "h_old": h_old.numpy(),
        "sigma": sigma.numpy(),
        "new": features(m2, images),
        "labels": dataset.labels,
    }


def target(version: str) -> VersionInfo:
    return VersionInfo(version, "m2", D_NEW, True, "set by the pipeline")


def backfill(gallery, version: str, budget: float, source: str = "v1", actors: int = 1, **kwargs):
    """One actor (start-up is most of a run on this data), two where concurrency is tested."""
    kwargs.setdefault("transformation", gallery["h"])
    return partial_backfill_version(
        gallery["store"],
        "g",
        source,
        target(version),
        model=gallery["m2"],
        images=IMAGES,
        budget=budget,
        options=dataclasses.replace(RUN, actors=actors),
        **kwargs,
    )


def read(gallery, version: str) -> dict:
    """The version's columns as arrays indexed by id (ids are the digits' row numbers)."""
    table = gallery["store"].read("g", version)
    order = np.argsort(table["id"].to_numpy())
    assert np.array_equal(table["id"].to_numpy()[order], np.arange(ROWS))
    out = {"table": table}
    for name in table.column_names:
        column = table[name].combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            out[name] = column.flatten().to_numpy().reshape(len(column), -1)[order]
        else:
            out[name] = column.to_numpy(zero_copy_only=False)[order]
    out["extracted"] = np.flatnonzero(out["provenance"] == "extracted")
    return out


def assert_rows(gallery, out: dict) -> None:
    """Extracted rows are m2's features of their images, the others h(old)."""
    extracted = out["provenance"] == "extracted"
    cosine = (out["embedding"][extracted] * gallery["new"][extracted]).sum(1)
    assert (cosine >= 0.9999).all()
    np.testing.assert_allclose(
        out["embedding"][~extracted], gallery["h_old"][~extracted], rtol=1e-4, atol=1e-5
    )
    np.testing.assert_array_equal(out["label"], gallery["labels"])


@pytest.fixture(scope="module")
def uncertainty_run(gallery, ray_local):
    """v2: budget 0.3, most uncertain first, uninterrupted."""
    return backfill(gallery, "v2", 0.3, actors=2), read(gallery, "v2")


@pytest.mark.ray
def test_the_k_most_uncertain_rows_are_extracted_the_rest_transformed(gallery, uncertainty_run):
    summary, out = uncertainty_run
    k = round(0.3 * ROWS)
    assert (summary["extracted"], summary["newly_extracted"], summary["already_extracted"]) == (
        k,
        k,
        0,
    )
    # the single-process reference: sigma of every row in one call, FastFill's order
    expected = backfill_order(gallery["sigma"])[:k]
    np.testing.assert_array_equal(out["extracted"], np.sort(expected))
    np.testing.assert_allclose(out["uncertainty"], gallery["sigma"], rtol=1e-5, atol=1e-6)
    assert_rows(gallery, out)
    info = summary["version"]
    assert info.lineage == (
        "v2 = partial_backfill(v1, h=h, extract=m2, budget=0.3, order=uncertainty)"
    )
    assert info.ids == gallery["store"].version("g", "v1").ids  # committed from part records
    assert len(info.files) == 6 and summary["threshold"]["id"] in expected
    assert summary["threshold"]["key"] == pytest.approx(gallery["sigma"][expected[-1]], abs=1e-6)
    schema = out["table"].schema
    assert schema.field("provenance").type == pa.string()
    assert schema.field("uncertainty").type == pa.float32()


@pytest.mark.ray
def test_budget_zero_transforms_every_row_and_budget_one_extracts_every_row(gallery, ray_local):
    none = backfill(gallery, "b0", 0.0)
    out = read(gallery, "b0")
    assert none["extracted"] == 0 and none["threshold"] is None and out["extracted"].size == 0
    assert_rows(gallery, out)
    every = backfill(gallery, "b1", 1.0, order="random", transformation=gallery["h_plain"])
    out = read(gallery, "b1")
    assert every["extracted"] == ROWS and out["extracted"].size == ROWS
    assert "uncertainty" not in out  # h without the head: no sigma to store
    assert_rows(gallery, out)


@pytest.mark.ray
def test_random_order_is_a_pure_function_of_the_seed(gallery, ray_local):
    k = round(0.25 * ROWS)
    summary = backfill(gallery, "r1", 0.25, order="random", seed=1)
    out = read(gallery, "r1")
    assert_rows(gallery, out)
    ids = pa.array(np.arange(ROWS, dtype=np.int64))
    sample = {seed: np.sort(backfill_order(random_keys(ids, seed))[:k]) for seed in (0, 1)}
    np.testing.assert_array_equal(out["extracted"], sample[1])  # the seeded hash's first k
    assert len(set(sample[0]) & set(sample[1])) < 0.5 * k  # another seed, another sample
    assert summary["version"].lineage.endswith("order=random, seed=1)")
    np.testing.assert_allclose(out["uncertainty"], gallery["sigma"], rtol=1e-5, atol=1e-6)


@pytest.mark.ray
def test_a_failed_run_resumes_and_equals_an_uninterrupted_run(
    gallery, uncertainty_run, tmp_path, monkeypatch
):
    marker = tmp_path / "failed"

    class FailOnce(backfill_module.BackfillChunks):
        def fill(self, chunk, writer):
            if chunk.part == "part-00001-0000.parquet" and not marker.exists():
                marker.write_text("failed once")
                raise RuntimeError("injected failure half-way")
            super().fill(chunk, writer)

    with monkeypatch.context() as patch:
        patch.setattr(
            runner_module,
            "run_chunks",
            lambda chunks, worker, *args: run_chunks(chunks, FailOnce, *args),
        )
        with pytest.raises(PipelineError, match="injected failure half-way"):
            backfill(gallery, "v3", 0.3)
    store = gallery["store"]
    assert "v3" not in [v.version for v in store.versions("g")]
    staging = store.begin("g", target("v3"), "partial-backfill-v1")
    done = {p: os.stat(p) for p in staging.files()}
    staging.release()
    assert 0 < len(done) < 6 and "part-00001-0000.parquet" not in {part_of_file(p) for p in done}
    summary = backfill(gallery, "v3", 0.3, actors=2)  # another pool size: the plan is the same
    assert summary["selection_resumed"] and summary["rows_skipped"] == 100 * len(done)
    for path, before in done.items():  # finished parts were skipped, not rewritten
        after = os.stat(path)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    out, reference = read(gallery, "v3"), uncertainty_run[1]
    for name in ("id", "provenance", "embedding", "uncertainty", "label"):
        np.testing.assert_array_equal(out[name], reference[name])


@pytest.mark.ray
def test_raising_the_budget_extracts_only_the_new_rows(gallery, uncertainty_run, monkeypatch):
    """v2 (budget 0.3) -> p5 (budget 0.5): v2's extracted rows are copied, 20% more extracted."""
    before = uncertainty_run[1]
    raised = backfill(gallery, "p5", 0.5, source="v2", transformation=None)
    after = read(gallery, "p5")
    k3, k5 = round(0.3 * ROWS), round(0.5 * ROWS)
    assert (raised["extracted"], raised["already_extracted"], raised["newly_extracted"]) == (
        k5,
        k3,
        k5 - k3,
    )
    assert after["extracted"].size == k5
    assert set(before["extracted"]) <= set(after["extracted"])
    # the same rows as backfilling 50% at once; rows not extracted now are copied as stored
    expected = np.sort(backfill_order(gallery["sigma"])[:k5])
    np.testing.assert_array_equal(after["extracted"], expected)
    kept = (before["provenance"] == "extracted") | (after["provenance"] == "transformed")
    np.testing.assert_array_equal(after["embedding"][kept], before["embedding"][kept])
    np.testing.assert_array_equal(after["uncertainty"], before["uncertainty"])
    assert_rows(gallery, after)
    assert raised["version"].lineage == (
        "p5 = partial_backfill(v2, extract=m2, budget=0.5, order=uncertainty)"
    )
    # pass A counted the source's extracted rows from the key files too (the fallback for
    # sources without the writer's counts)
    staging = Path(gallery["store"].path("g", "_data", "p5", "partial-backfill-v2"))
    assert json.loads((staging / "_selection.json").read_text())["already_extracted"] == k3
    # a lower budget would turn extracted rows back into h(old): refused before any work
    monkeypatch.setattr(selection_module, "run_chunks", no_ray)
    monkeypatch.setattr(runner_module, "run_chunks", no_ray)
    for budget in (0.1, 0.0):
        with pytest.raises(ConfigError, match=r"holds 180 extracted rows already.*budget >= 0.3"):
            backfill(gallery, "p1", budget, source="v2", transformation=None)
    assert not Path(gallery["store"].path("g", "_data", "p1")).exists()


def no_ray(*args, **kwargs):
    raise AssertionError("Ray work started")


@pytest.mark.parametrize("budget", [-0.1, 1.5, math.nan, "0.3"])
def test_bad_budgets_are_refused_before_any_work(gallery, budget, monkeypatch):
    monkeypatch.setattr(selection_module, "run_chunks", no_ray)
    monkeypatch.setattr(runner_module, "run_chunks", no_ray)
    with pytest.raises(ConfigError, match="budget must be"):
        backfill(gallery, "bad", budget)
    assert not Path(gallery["store"].path("g", "_data", "bad")).exists()


def test_uncertainty_order_needs_the_head_and_other_misuse_is_refused(gallery, monkeypatch):
    monkeypatch.setattr(selection_module, "run_chunks", no_ray)
    monkeypatch.setattr(runner_module, "run_chunks", no_ray)
    h_plain = gallery["h_plain"]
    with pytest.raises(ConfigError, match=f"uncertainty head, but {h_plain}/h.json has none"):
        backfill(gallery, "bad", 0.3, transformation=h_plain)
    with pytest.raises(ConfigError, match="order must be one of"):
        backfill(gallery, "bad", 0.3, order="oracle")
    with pytest.raises(ConfigError, match="needs the transformation h"):
        backfill(gallery, "bad", 0.3, transformation=None)
    with pytest.raises(ConfigError, match="only the 'dataset' source"):
        partial_backfill_version(
            gallery["store"],
            "g",
            "v1",
            target("bad"),
            gallery["h"],
            gallery["m2"],
            SourceSpec(kind="parquet_images", paths=["x.parquet"]),
            0.3,
        )
    assert not Path(gallery["store"].path("g", "_data", "bad")).exists()


def test_provenance_and_uncertainty_values_are_validated():
    table = pa.table(
        {
            "id": [1, 2],
            "provenance": ["transformed", "guessed"],
            "uncertainty": pa.array([0.5, 1.0], pa.float32()),
        }
    )
    with pytest.raises(SchemaError, match=r"row 1 has provenance 'guessed'"):
        validate_values(table, 4, "t.parquet")
    table = table.set_column(1, "provenance", pa.array(["extracted", "transformed"]))
    validate_values(table, 4, "t.parquet")
    table = table.set_column(2, "uncertainty", pa.array([0.5, math.nan], pa.float32()))
    with pytest.raises(SchemaError, match="uncertainty are NaN/inf; first is row 1"):
        validate_values(table, 4, "t.parquet")


@pytest.mark.parametrize(
    "ids", [np.arange(40) * 7 % 40, [f"id{(i * 7) % 40:02d}" for i in range(40)]]
)
def test_the_threshold_selects_exactly_the_first_k_rows_in_key_then_id_order(ids):
    """Ties (repeated keys, +inf for rows extracted earlier) go to the smaller id."""
    keys = np.random.default_rng(0).integers(0, 6, 40).astype(np.float64)
    keys[[3, 17, 29]] = np.inf
    ids = pa.array(ids)
    order = sorted(range(40), key=lambda i: (-keys[i], ids[i].as_py()))
    for k in range(1, 40):
        kth = order[k - 1]
        selection = Selection(40, k, 3, Threshold(float(keys[kth]), ids[kth].as_py()))
        selection = Selection.from_json(selection.to_json(), "test")  # as a rerun reads it
        assert set(np.flatnonzero(selection.selects(keys, ids))) == set(order[:k])
    assert (
        not Selection(40, 0).selects(None, ids).any() and Selection(40, 40).selects(None, ids).all()
    )
