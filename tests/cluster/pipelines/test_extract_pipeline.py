"""Extraction as two pools (``decode.py``, ``extract.py``): pool sizes from given resources,
chunk sizes from the decoded block, the decode stage never fused into the model actors, and the
whole pipeline on a local Ray against a naive in-process reference, bit for bit, including a
corrupt image that fails the run by file and row and a rerun that resumes."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from raycompat.cluster.pipelines import PipelineError, RunOptions, SourceSpec, extract_version
from raycompat.cluster.pipelines.decode import chunk_rows, decode_chunks, plan_pools
from raycompat.cluster.pipelines.extract import ExtractChunks
from raycompat.cluster.pipelines.parts import Chunk
from raycompat.cluster.pipelines.runner import Stage, chunk_dataset
from raycompat.config.train import ModelSpec
from raycompat.data import read_image
from raycompat.data.augment import AUGMENTATIONS
from raycompat.store import GalleryStore, VersionInfo
from raycompat.train.export import build_model, export_model, load_exported_model

ROWS, SIZE, SEED = 50, 24, 3


@pytest.mark.parametrize(
    "run, nodes, chunks, want",
    [
        # as configured, every other CPU decodes
        (RunOptions(actors=2), [{"CPU": 4}], 10, (2, 0.0, 2)),
        # one GPU actor per GPU, all the other CPUs (on any node) decode
        (RunOptions(pool="auto"), [{"CPU": 16, "GPU": 1}], 100, (1, 1.0, 15)),
        (RunOptions(pool="auto"), [{"CPU": 8, "GPU": 2}, {"CPU": 32}], 100, (2, 1.0, 38)),
        (RunOptions(pool="auto", threads_per_actor=4), [{"CPU": 16, "GPU": 1}], 100, (1, 1.0, 12)),
        # no GPU: half the CPUs embed
        (RunOptions(pool="auto", threads_per_actor=2), [{"CPU": 8}], 100, (2, 0.0, 4)),
        (RunOptions(pool="auto"), [{"CPU": 2}], 100, (1, 0.0, 1)),
        # the config's decode workers, no more workers than chunks
        (RunOptions(actors=1, decode_workers=3), [{"CPU": 8}], 100, (1, 0.0, 3)),
        (RunOptions(actors=4), [{"CPU": 64}], 2, (2, 0.0, 2)),
        # two actors on 2 CPUs would leave none to decode: one actor
        (RunOptions(actors=2), [{"CPU": 2}], 10, (1, 0.0, 1)),
        # fixed GPU actors, never more than the GPUs hold
        (RunOptions(actors=4, num_gpus_per_actor=0.5), [{"CPU": 8, "GPU": 1}], 9, (2, 0.5, 6)),
    ],
)
def test_pool_sizes_follow_the_resources(run, nodes, chunks, want):
    pools = plan_pools(run, nodes, chunks)
    got = (pools.model.actors, pools.model.num_gpus_per_actor, pools.decode_workers)
    assert got == want
    assert pools.model.pool == "fixed"
    assert plan_pools(pools.model, nodes, chunks) == pools  # sizing again changes nothing


@pytest.mark.parametrize(
    "run, nodes, message",
    [
        (RunOptions(num_gpus_per_actor=1), [{"CPU": 8}], r"num_gpus_per_actor is 1.* 0 GPU"),
        (RunOptions(actors=1, decode_workers=4), [{"CPU": 4}], r"1 model actor.* 4 decode.* 4 CPU"),
        (RunOptions(actors=1, threads_per_actor=4), [{"CPU": 4}], r"1 model actor.*x 4 CPU"),
    ],
)
def test_pool_sizes_that_cannot_start_are_refused(run, nodes, message):
    with pytest.raises(ValueError, match=message):
        plan_pools(run, nodes, 10)


def test_chunk_rows_cap_a_decoded_block():
    shape = (3, 112, 112)  # 147 KiB of float32 each: 891 in 128 MiB
    assert chunk_rows(RunOptions(), shape) == 891
    assert chunk_rows(RunOptions(batch_size=256), shape) == 768  # whole batches
    assert chunk_rows(RunOptions(batch_size=256, decode_block_mib=512), shape) == 3328
    assert chunk_rows(RunOptions(rows_per_file=500), shape) == 500
    assert chunk_rows(RunOptions(decode_block_mib=1), (3, 1024, 1024)) == 1  # never 0
    assert chunk_rows(RunOptions(rows_per_file=77), None) == 77  # an empty source
    # a source that hands uint8 over: a quarter of the bytes, four times the rows
    assert chunk_rows(RunOptions(), shape, itemsize=1) == 3566
    assert chunk_rows(RunOptions(batch_size=256), shape, itemsize=1) == 3328


def jpeg_images(corrupt_row: int | None = None) -> list[bytes]:
    rng = np.random.default_rng(0)
    encoded = []
    for _ in range(ROWS):
        image = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))
        buffer = io.BytesIO()
        image.resize((30, 27), Image.Resampling.BILINEAR).save(buffer, format="JPEG")
        encoded.append(buffer.getvalue())
    if corrupt_row is not None:
        encoded[corrupt_row] = encoded[corrupt_row][:150]  # truncated
    return encoded


def write_images(path: Path, encoded: list[bytes]) -> None:
    ids = [f"img{r:03d}" for r in range(ROWS)]
    table = pa.table({"id": ids, "image": encoded, "label": np.arange(ROWS) % 4})
    pq.write_table(table, path, row_group_size=10)


def exported_lenet(directory: Path) -> str:
    spec = ModelSpec(
        backbone="lenetpp",
        head="linear",
        num_classes=4,
        embed_dim=8,
        backbone_kwargs={"in_chans": 3, "image_size": SIZE},
    )
    torch.manual_seed(0)
    export_model(directory, build_model(spec).state_dict(), spec)
    return str(directory)


@contextlib.contextmanager
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the model actor (threads_per_actor=1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def naive_reference(model_dir: str, encoded: list[bytes], chunk: int, batch: int) -> np.ndarray:
    """What the model actor computed when it decoded its chunks itself: Pillow image by image,
    ``crop_flip`` drawn image by image from the chunk's generator, the model on batches of
    ``batch`` from each chunk's start, L2-normalised."""
    model = load_exported_model(model_dir)[0]
    crop_flip = AUGMENTATIONS.get("crop_flip")
    out = []
    with one_torch_thread(), torch.inference_mode():
        for start in range(0, ROWS, chunk):
            generator = torch.Generator().manual_seed(SEED * 1_000_003 + start)
            images = torch.stack(
                [
                    crop_flip(read_image(e, size=(SIZE, SIZE)), generator)
                    for e in encoded[start : start + chunk]
                ]
            )
            for s in range(0, len(images), batch):
                out.append(F.normalize(model.forward_features(images[s : s + batch]), dim=1))
    return torch.cat(out).numpy()


@pytest.mark.ray
def test_pools_give_the_reference_embeddings_and_a_corrupt_image_fails_by_row(tmp_path, ray_local):
    model_dir = exported_lenet(tmp_path / "model")
    path = tmp_path / "images.parquet"
    source = SourceSpec(kind="parquet_images", paths=[str(path)], image_size=SIZE)
    store = GalleryStore(str(tmp_path / "store"))
    info = VersionInfo("v1", "lenet", 8, True, "v1 = extract(lenet)")
    run = RunOptions(rows_per_file=20, batch_size=6, actors=1, progress_every_s=1)

    write_images(path, jpeg_images(corrupt_row=33))
    with pytest.raises(PipelineError, match=r"cannot decode image .*images\.parquet row 33"):
        extract_version(store, "g", info, model_dir, source, run, "crop_flip", SEED)
    assert [v.version for v in store.versions("g")] == []

    encoded = jpeg_images()
    write_images(path, encoded)  # the same rows and row groups: the rerun resumes
    result = extract_version(store, "g", info, model_dir, source, run, "crop_flip", SEED)
    # chunks of rows 0..19 and 40..49 may have been written before the failure; 20..39 never
    assert result["rows_skipped"] in (0, 10, 20, 30)
    assert result["rows_written"] + result["rows_skipped"] == ROWS
    out = store.read("g", "v1")
    order = np.argsort(out["id"].to_numpy(zero_copy_only=False))
    assert out["id"].to_numpy(zero_copy_only=False)[order].tolist() == [
        f"img{r:03d}" for r in range(ROWS)
    ]
    np.testing.assert_array_equal(out["label"].to_numpy()[order], np.arange(ROWS) % 4)
    embeddings = np.stack(out["embedding"].to_numpy(zero_copy_only=False))[order]
    expected = naive_reference(model_dir, encoded, chunk=20, batch=6)
    np.testing.assert_array_equal(embeddings, expected)  # on CPU: bit for bit


@pytest.mark.ray
def test_the_decode_stage_runs_in_its_own_processes(ray_local, capsys):
    """Ray Data fuses a task map into the actor map after it when their arguments agree: the
    decoding would then run inside the model actors. Equal pool sizes are the risky case."""
    chunks = [Chunk(f"part-00000-{k:04d}.parquet", 0, "", 10 * k, 10 * k + 10) for k in range(2)]
    stage = Stage(decode_chunks, {"source": SourceSpec()}, workers=1)
    run = RunOptions(actors=1)
    chunk_dataset(chunks, ExtractChunks, {}, run, stage).explain()
    physical = capsys.readouterr().out.split("Physical Plan (Optimized)")[1]
    assert "MapBatches(decode_chunks)]" in physical
    assert "MapBatches(ExtractChunks)]" in physical
    assert "decode_chunks)->" not in physical
