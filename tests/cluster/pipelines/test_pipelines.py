"""Ray Data pipelines: FCT transformation and extraction against single-process references,
resume after a failure half-way, and one test per bad input (the output is never published)."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from raycompat.cluster.pipelines import (
    PipelineError,
    PlanMismatchError,
    RunOptions,
    SourceSpec,
    extract_version,
    identity_upgrade,
    transform_version,
)
from raycompat.cluster.pipelines import runner as runner_module
from raycompat.cluster.pipelines import transform as transform_module
from raycompat.cluster.pipelines.parts import Chunk
from raycompat.cluster.pipelines.resume import record_plan
from raycompat.cluster.pipelines.runner import run_chunks
from raycompat.config.train import ModelSpec
from raycompat.data import create_dataset, read_image
from raycompat.errors import ConfigError
from raycompat.store import (
    CorruptFileError,
    DuplicateIdError,
    GalleryStore,
    ManifestError,
    PublishConflictError,
    SchemaError,
    VersionInfo,
    embedding_table,
)
from raycompat.store.commit.part_record import part_of_file
from raycompat.train.export import export_model, load_exported_model
from raycompat.transformations import (
    FCTTransformation,
    load_transformation,
    save_transformation,
    side_info_transformation,
)

D_OLD, D_SIDE, D_NEW, D_SIDE_NEW = 32, 8, 16, 8


def make_source(
    root: Path | str,
    gallery: str,
    rows: int,
    files: int,
    group_rows: int,
    storage_options: dict | None = None,
) -> GalleryStore:
    """Publish ``gallery/v1``: ``files`` Parquet files of ``group_rows``-row groups, int ids.
    ``root`` may be an ``s3://`` URI (with ``storage_options``)."""
    store = GalleryStore(str(root), storage_options)
    info = VersionInfo("v1", "m1", D_OLD, False, "v1 = extract(m1)", side_info_width=D_SIDE)
    staging = store.begin(gallery, info, "init")
    rng = np.random.default_rng(0)
    for k, ids in enumerate(np.array_split(np.arange(rows, dtype=np.int64) * 3 + 1, files)):
        table = embedding_table(
            ids,
            rng.standard_normal((len(ids), D_OLD)),
            rng.standard_normal((len(ids), D_SIDE)),
            labels=ids % 5,
        )
        staging.write_table(table, f"in-{k}.parquet", row_group_size=group_rows)
    staging.commit(expected_rows=rows)
    return store


def random_models(directory: Path) -> tuple[str, str]:
    """h and g with random weights and BN statistics (so eval-mode BN is not the identity)."""
    torch.manual_seed(0)
    h = FCTTransformation(D_OLD, D_SIDE, D_NEW, width=64)
    g = side_info_transformation(D_OLD, D_SIDE, D_SIDE_NEW, width=64)
    for module in (h, g):
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
    save_transformation(directory / "fct", h, "h")  # the training run's layout: h.* and g.*
    save_transformation(directory / "fct", g, "g")
    return str(directory / "fct"), str(directory / "fct")


def target(version: str = "v2") -> VersionInfo:
    return VersionInfo(version, "m2", D_NEW, False, f"{version} = h(v1)", D_SIDE_NEW)


def reference(store: GalleryStore, gallery: str, h_dir: str, g_dir: str) -> dict:
    """Single-process: the whole table through h and g in one call, keyed by id."""
    table = store.read(gallery, "v1")
    n = table.num_rows
    old, side = (
        torch.tensor(table[c].combine_chunks().flatten().to_numpy().reshape(n, -1))
        for c in ("embedding", "side_info")
    )
    with torch.no_grad():
        new = load_transformation(h_dir)(old, side).numpy()
        new_side = load_transformation(g_dir, "g")(old, side).numpy()
    return {
        "ids": table["id"].to_numpy(),
        "new": new,
        "side": new_side,
        "labels": table["label"].to_numpy(),
    }


def by_id(table: pa.Table, column: str) -> np.ndarray:
    order = np.argsort(table["id"].to_numpy())
    values = table[column].combine_chunks()
    if pa.types.is_fixed_size_list(values.type):
        return values.flatten().to_numpy().reshape(len(values), -1)[order]
    return values.to_numpy()[order]


def load_job(path: Path):
    spec = importlib.util.spec_from_file_location("transform_job", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def published(store: GalleryStore, gallery: str) -> list[str]:
    return [v.version for v in store.versions(gallery)]


@pytest.mark.ray
@pytest.mark.slow
def test_transform_200k_rows_equals_single_process_reference(tmp_path, ray_local):
    store = make_source(tmp_path / "store", "big", rows=200_000, files=4, group_rows=10_000)
    h_dir, g_dir = random_models(tmp_path)
    run = RunOptions(rows_per_file=25_000, batch_size=8192, actors=2, progress_every_s=1)
    result = transform_version(store, "big", "v1", target(), h_dir, g_dir, run)
    info = result["version"]
    # 4 files x 50k rows in 10k-row groups; chunks close at >= 25k rows: 30k + 20k per file
    assert sorted(part_of_file(f) for f in info.files) == [
        f"part-{i:05d}-{k:04d}.parquet" for i in range(4) for k in range(2)
    ]
    for rel in info.files:
        rows = pq.ParquetFile(store.path("big", rel)).metadata.num_rows
        assert rows == (30_000 if rel.endswith("-0000.parquet") else 20_000)
    out = store.read("big", "v2")
    ref = reference(store, "big", h_dir, g_dir)
    order = np.argsort(ref["ids"])
    np.testing.assert_array_equal(np.sort(out["id"].to_numpy()), ref["ids"][order])
    np.testing.assert_allclose(by_id(out, "embedding"), ref["new"][order], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(by_id(out, "side_info"), ref["side"][order], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(by_id(out, "label"), ref["labels"][order])
    assert result["rows_written"] == 200_000 and result["rows_skipped"] == 0


def failing_worker(marker: Path):
    """A worker that fails on the first chunk of input 2 while ``marker`` does not exist."""

    class FailOnceTransform(transform_module.TransformChunks):
        def fill(self, chunk, writer):
            if chunk.part == "part-00002-0000.parquet" and not marker.exists():
                marker.write_text("failed once")
                raise RuntimeError("injected failure half-way")
            super().fill(chunk, writer)

    return FailOnceTransform


@pytest.mark.ray
def test_transform_resumes_after_a_failure_without_rewriting_done_parts(
    tmp_path, ray_local, monkeypatch
):
    store = make_source(tmp_path / "store", "g", rows=8_000, files=4, group_rows=1_000)
    h_dir, g_dir = random_models(tmp_path)
    run = RunOptions(rows_per_file=1_000, batch_size=500, actors=1)
    with monkeypatch.context() as patch:
        failing = failing_worker(tmp_path / "marker")
        patch.setattr(  # swap the worker class only: TransformChunks stays importable by name
            runner_module,
            "run_chunks",
            lambda chunks, worker, *args: run_chunks(chunks, failing, *args),
        )
        with pytest.raises(PipelineError, match="injected failure half-way"):
            transform_version(store, "g", "v1", target(), h_dir, g_dir, run)
    assert (tmp_path / "marker").exists()
    assert published(store, "g") == ["v1"]  # nothing published on error
    staging = store.begin("g", target(), "transform-v1")  # the failed job released its lease
    done = {p: os.stat(p) for p in staging.files()}
    staging.release()
    assert "part-00002-0000.parquet" not in {part_of_file(p) for p in done}
    result = transform_version(store, "g", "v1", target(), h_dir, g_dir, run)
    assert result["rows_skipped"] == 1_000 * len(done)
    assert result["rows_written"] == 8_000 - 1_000 * len(done)
    for path, before in done.items():  # finished parts were skipped, not rewritten
        after = os.stat(path)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    out = store.read("g", "v2")
    ids = out["id"].to_numpy()
    assert len(ids) == len(set(ids.tolist())) == 8_000
    assert set(ids.tolist()) == set(store.read("g", "v1")["id"].to_numpy().tolist())
    ref = reference(store, "g", h_dir, g_dir)
    np.testing.assert_allclose(
        by_id(out, "embedding"), ref["new"][np.argsort(ref["ids"])], rtol=1e-4, atol=1e-5
    )


def test_rerun_with_another_chunking_is_refused(tmp_path):
    store = make_source(tmp_path / "store", "g", rows=4_000, files=2, group_rows=1_000)
    staging = store.begin("g", target(), "job")
    chunks = [Chunk("part-00000-0000.parquet", 0, "p", 0, 2_000, [0, 1])]
    record_plan(staging, {"rows_per_file": 2_000}, chunks)
    record_plan(staging, {"rows_per_file": 2_000}, chunks)  # same plan: fine
    with pytest.raises(PlanMismatchError, match="rows_per_file.*2000, 1000"):
        record_plan(staging, {"rows_per_file": 1_000}, chunks[:1])


@pytest.fixture
def small(tmp_path):
    """A published 2-file source (4k rows) and h/g directories."""
    store = make_source(tmp_path / "store", "g", rows=4_000, files=2, group_rows=1_000)
    return store, *random_models(tmp_path)


def assert_not_started(store: GalleryStore) -> None:
    assert published(store, "g") == ["v1"]
    assert not Path(store.path("g", "_data", "v2")).exists()  # failed before any work


def test_missing_source_version_fails_before_any_work(small):
    store, h_dir, g_dir = small
    with pytest.raises(ManifestError, match="no version 'v9'.*'v1'"):
        transform_version(store, "g", "v9", target(), h_dir, g_dir)
    assert_not_started(store)


def test_width_mismatch_with_the_transformation_fails_before_any_work(small, tmp_path):
    store, _, g_dir = small
    save_transformation(tmp_path / "h33", FCTTransformation(D_OLD + 1, D_SIDE, D_NEW, width=8))
    with pytest.raises(SchemaError, match=f"source v1 width is {D_OLD} but .*h33 d_old is 33"):
        transform_version(store, "g", "v1", target(), str(tmp_path / "h33"), g_dir)
    with pytest.raises(SchemaError, match="target v2 width is 17 but .*d_new is 16"):
        wide = VersionInfo("v2", "m2", D_NEW + 1, False, "v2 = h(v1)", D_SIDE_NEW)
        transform_version(store, "g", "v1", wide, small[1], g_dir)
    assert_not_started(store)


def forget_file_sizes(store: GalleryStore, gallery: str, version: str) -> None:
    """Make the version's record one from before records held file sizes, so that the tests
    below reach the input checks they are about (a file changed behind a record that has its
    size is refused before any of them, ``test_store.py::test_truncated_published_file``)."""
    path = Path(store.path(gallery, "_versions", f"{version}.json"))
    raw = json.loads(path.read_text())
    raw.pop("file_info")
    path.write_text(json.dumps(raw))


def test_input_file_missing_a_column_is_named(small):
    store, h_dir, g_dir = small
    path = store.path("g", store.version("g", "v1").files[0])
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["side_info"]), path)
    forget_file_sizes(store, "g", "v1")
    with pytest.raises(SchemaError, match=r"in-0\.parquet: missing column 'side_info'"):
        transform_version(store, "g", "v1", target(), h_dir, g_dir)
    assert_not_started(store)


def test_corrupt_parquet_input_is_named(small):
    store, h_dir, g_dir = small
    path = store.path("g", store.version("g", "v1").files[1])
    Path(path).write_bytes(b"PAR1 this is not a parquet file PAR1")
    forget_file_sizes(store, "g", "v1")
    with pytest.raises(CorruptFileError, match=r"in-1\.parquet: not a readable Parquet file"):
        transform_version(store, "g", "v1", target(), h_dir, g_dir)
    assert_not_started(store)


@pytest.mark.ray
def test_nan_in_input_rows_names_file_and_row_and_publishes_nothing(small, ray_local):
    store, h_dir, g_dir = small
    path = store.path("g", store.version("g", "v1").files[1])
    table = pq.read_table(path)
    x = table["embedding"].combine_chunks().flatten().to_numpy().reshape(len(table), -1).copy()
    x[1017, 3] = np.nan  # row 1017 of the file: second row group
    column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), D_OLD)
    table = table.set_column(table.schema.get_field_index("embedding"), "embedding", column)
    pq.write_table(table, path, row_group_size=1_000)
    forget_file_sizes(store, "g", "v1")
    run = RunOptions(rows_per_file=1_000, batch_size=500, actors=1)
    with pytest.raises(PipelineError, match=r"in-1\.parquet: 1 row\(s\) of embedding .* row 1017"):
        transform_version(store, "g", "v1", target(), h_dir, g_dir, run)
    assert published(store, "g") == ["v1"]


def test_identity_upgrade_writes_nothing(small):
    store, _, _ = small
    before = sorted(p for p in Path(store.root).rglob("*"))
    upgrade = identity_upgrade(store, "g", "v1", "m1-bct")
    assert (upgrade.version, upgrade.model_version, upgrade.rows) == ("v1", "m1-bct", 4_000)
    assert sorted(p for p in Path(store.root).rglob("*")) == before
    with pytest.raises(ManifestError, match="no version 'v7'"):
        identity_upgrade(store, "g", "v7", "m")


def exported_lenet(directory: Path) -> str:
    spec = ModelSpec(
        backbone="lenetpp",
        head="linear",
        num_classes=10,
        embed_dim=8,
        backbone_kwargs={"in_chans": 3, "image_size": 32},
    )
    from raycompat.train.export import build_model

    torch.manual_seed(1)
    export_model(directory, build_model(spec).state_dict(), spec)
    return str(directory)


def png(image: torch.Tensor) -> bytes:
    array = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.ray
def test_extraction_equals_in_process_forward_features(tmp_path, ray_local):
    model_dir = exported_lenet(tmp_path / "model")
    model = load_exported_model(model_dir)[0]
    options = {"num_classes": 10, "images_per_class": 20, "image_size": 32, "seed": 3}
    dataset = create_dataset("synthetic", **options)
    images = torch.stack([dataset[i][0] for i in range(len(dataset))])
    store = GalleryStore(str(tmp_path / "store"))
    run = RunOptions(rows_per_file=64, batch_size=16, actors=2)
    info = VersionInfo("v1", "lenet", 8, True, "v1 = extract(lenet)")
    spec = SourceSpec(kind="dataset", name="synthetic", options=options)
    result = extract_version(store, "syn", info, model_dir, spec, run)
    assert [part_of_file(f) for f in result["version"].files] == [
        f"part-00000-{k:04d}.parquet"
        for k in range(4)  # 200 rows: 64 + 64 + 64 + 8
    ]
    out = store.read("syn", "v1")
    with torch.no_grad():
        expected = F.normalize(model.forward_features(images), dim=1).numpy()
    np.testing.assert_array_equal(by_id(out, "id"), np.arange(200))
    np.testing.assert_allclose(by_id(out, "embedding"), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(by_id(out, "label"), dataset.labels)

    # The same images as a Parquet of PNG bytes with string ids.
    encoded = [png(image) for image in images]
    files = []
    for k, rows in enumerate(np.array_split(np.arange(200), 2)):
        files.append(str(tmp_path / f"images-{k}.parquet"))
        ids = pa.array([f"img{r:03d}" for r in rows])
        pq.write_table(
            pa.table(
                {
                    "id": ids,
                    "image": pa.array([encoded[r] for r in rows]),
                    "label": pa.array(dataset.labels[rows]),
                }
            ),
            files[-1],
        )
    spec = SourceSpec(kind="parquet_images", paths=files, mode="RGB")
    # ids grouped on the cluster, commit from part records (the path of 10^9-row extractions)
    distributed = dataclasses.replace(run, unique_ids="distributed")
    extract_version(store, "png", info, model_dir, spec, distributed)
    out = store.read("png", "v1")
    decoded = torch.stack([read_image(e) for e in encoded])
    with torch.no_grad():
        expected = F.normalize(model.forward_features(decoded), dim=1).numpy()
    assert sorted(out["id"].to_pylist()) == [f"img{r:03d}" for r in range(200)]
    assert store.version("png", "v1").ids is not None
    np.testing.assert_allclose(by_id(out, "embedding"), expected, rtol=1e-4, atol=1e-5)

    pq.write_table(pa.table({"id": [1], "pixels": [b"x"]}), tmp_path / "bad.parquet")
    bad = SourceSpec(kind="parquet_images", paths=[str(tmp_path / "bad.parquet")])
    with pytest.raises(SchemaError, match=r"bad\.parquet: missing column\(s\) \['image'\]"):
        extract_version(store, "bad", info, model_dir, bad, run)
    assert published(store, "bad") == []


@pytest.mark.ray
def test_transform_job_main(small, tmp_path, ray_local):
    job = load_job(Path(__file__).parents[3] / "jobs" / "transform.py")
    store, h_dir, g_dir = small
    config = tmp_path / "job.yaml"
    config.write_text("mode: transform\nrun:\n  rows_per_file: 1500\n  actors: 1\n")
    args = [
        "--config",
        config,
        f"store.root={store.root}",
        "store.gallery=g",
        "source_version=v1",
        f"transformation={h_dir}",
        f"side_info_transformation={g_dir}",
        "target.version=v2",
        "target.model_version=m2",
        f"target.width={D_NEW}",
        f"target.side_info_width={D_SIDE_NEW}",
        "target.dtype=float16",
    ]
    summary = job.main([str(a) for a in args])
    # 2 files of 2 x 1000-row groups; a chunk closes at >= 1500 rows: one part per file
    assert (summary["version"], summary["rows"], summary["files"]) == ("v2", 4_000, 2)
    assert store.version("g", "v2").lineage == "v2 = h(v1)"
    # committed from part records (O(parts)): the parts' ids add up to the source's
    assert store.version("g", "v2").ids == store.version("g", "v1").ids is not None
    # stored as float16 (half the bytes), side info as float32
    schema = store.read("g", "v2").schema
    assert schema.field("embedding").type == pa.list_(pa.float16(), D_NEW)
    assert schema.field("side_info").type == pa.list_(pa.float32(), D_SIDE_NEW)
    # m2 queries what the job wrote (issue 40, item 8), registered without weights (the job
    # has h, not m2), so `raycompat search g --model m2` searches it with stored ids or vectors
    from raycompat.cli.app import main as cli
    from raycompat.store.catalog.models import Catalog

    catalog = Catalog(store)
    assert not catalog.model("m2").has_weights
    assert catalog.queryable_version("g", "m2").gallery_version == "v2"
    searched = ["search", "g", "--ids", "4", "--model", "m2", "-k", "1", "--store", store.root]
    assert cli(searched) == 0
    summary = job.main(
        [
            "--config",
            str(config),
            "mode=identity",
            f"store.root={store.root}",
            "store.gallery=g",
            "source_version=v2",
            "target.model_version=m3",
        ]
    )
    assert (summary["mode"], summary["version"], summary["rows"]) == ("identity", "v2", 4_000)
    # A rerun after the publish (a kill after it, a retried submission) is done, not a conflict.
    again = job.main([str(a) for a in args])
    assert again["already_published"] and (again["version"], again["rows"]) == ("v2", 4_000)
    args = [str(a) for a in args]
    other = [a for a in args if not a.startswith("target.model_version")] + [
        "target.model_version=m9"
    ]
    with pytest.raises(PublishConflictError, match="already published by model 'm2'"):
        job.main(other)


@pytest.mark.parametrize(
    "override, message",
    [
        ("transformation=/nowhere/h", "transformation: /nowhere/h/h.safetensors not found"),
        ("side_info_transformation=/nowhere/g", "/nowhere/g/g.safetensors not found"),
        ("source_version=v7", "source_version: gallery 'g' has no version 'v7'"),
    ],
)
def test_transform_job_checks_its_inputs_before_ray_starts(small, tmp_path, override, message):
    import ray

    job = load_job(Path(__file__).parents[3] / "jobs" / "transform.py")
    store, h_dir, g_dir = small
    args = [
        f"store.root={store.root}", "store.gallery=g", "source_version=v1",
        f"transformation={h_dir}", f"side_info_transformation={g_dir}",
        "target.version=v2", "target.model_version=m2", f"target.width={D_NEW}",
        f"target.side_info_width={D_SIDE_NEW}", override,
    ]
    was_running = ray.is_initialized()
    with pytest.raises(ConfigError, match=re.escape(message)):
        job.main(args)
    assert ray.is_initialized() == was_running  # refused before any ray.init
    assert published(store, "g") == ["v1"]


@pytest.mark.ray
@pytest.mark.slow
def test_distributed_unique_check_names_a_duplicate_id_and_its_files(tmp_path, ray_local):
    """Two image files that share an id: grouped by Ray Data, reported with both parts."""
    model_dir = exported_lenet(tmp_path / "model")
    image = png(torch.zeros(3, 32, 32))
    files = []
    for k, ids in enumerate((["a", "b", "dup"], ["dup", "c"])):
        files.append(str(tmp_path / f"images-{k}.parquet"))
        table = pa.table({"id": ids, "image": [image] * len(ids), "label": [0] * len(ids)})
        pq.write_table(table, files[-1])
    store = GalleryStore(str(tmp_path / "store"))
    info = VersionInfo("v1", "lenet", 8, True, "v1 = extract(lenet)")
    spec = SourceSpec(kind="parquet_images", paths=files, mode="RGB")
    run = RunOptions(rows_per_file=64, batch_size=16, actors=1, unique_ids="distributed")
    duplicate = r"duplicate id 'dup' \(2 rows\) in .*part-00000-0000.*, .*part-00001-0000"
    with pytest.raises(DuplicateIdError, match=duplicate):
        extract_version(store, "g", info, model_dir, spec, run)
    assert published(store, "g") == []
