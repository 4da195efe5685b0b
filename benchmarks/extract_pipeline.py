"""Extraction with a free model against the decode pool's own rate (issue 38, item 2 (c)).

    .venv/bin/python benchmarks/extract_pipeline.py --size 2000 6000 16000 \
        --out benchmarks/results/extract_pipeline_cpu.json

Images: ``--image-size`` px RGB JPEGs (quality 90, smooth random content) in one Parquet file of
``--row-group`` rows (made in a child process: the driver's RSS is the pipeline's), the
``parquet_images`` source. Model: ``free``, a backbone whose forward is
a per-channel mean and a linear map to ``--dim`` (it costs ~nothing next to decoding), exported
with ``export_model`` like any trained model and registered in every Ray worker by a
``worker_process_setup_hook``. Its pools come from ``pool: auto`` (``decode.plan_pools``: on
this 2-CPU machine one model actor and one decode worker; the JSON records them as ``pools``).

For each size N, ``--pairs`` interleaved rounds of:

- ``decode``: the decode pool's own rate: a plain ``multiprocessing`` pool of as many processes
  as the pipeline's decode workers, each opening the source once and looping over
  ``source.batches`` for its chunks (the same chunks, decoded and dropped); wall time from the
  pool's start (its processes import torch and decode one image) to the last chunk, and the
  span of its decoding alone;
- ``extract``: ``extract_version`` end to end: planning, the decode tasks, the model actor
  (forward, checks, part files with checksums), the verified publish.

A warm-up extraction of two chunks runs first, unmeasured. Reported: medians of images/s;
extract / decode per size and at the margin between the smallest and largest size
(``(N2 - N1) / (t2 - t1)``: fixed costs cancel: Ray's actor start-up, the plain pool's
processes importing torch). The target (>= 0.9) is ``margin_extract_over_decode_steady``: the
extraction's margin over the margin of the pool's decoding spans (from its first chunk's start
to its last one's end), so that the pool's start-up and its first, slower chunks cancel too;
the pool's wall-time margin swings with its ~5 s start-up here. Also: largest over smallest
size of the extraction's time per image and of the driver's peak RSS (sampled every 0.1 s;
the driver collects part records only, so it should stay flat), and the model actor's CPU per
image on its chunks (``actor_cpu_s``: with a free model, what reading the block, the checks
and writing the part cost the actor that would hold the GPU).
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import torch
from PIL import Image
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import DriverRSS, emit, machine_info  # noqa: E402

from raycompat.cluster.pipelines import RunOptions, SourceSpec, extract_version  # noqa: E402
from raycompat.cluster.pipelines.decode import chunk_rows, plan_pools  # noqa: E402
from raycompat.cluster.pipelines.sources import open_source  # noqa: E402
from raycompat.config.train import ModelSpec  # noqa: E402
from raycompat.data.augment import AUGMENTATIONS  # noqa: E402
from raycompat.store import GalleryStore, VersionInfo  # noqa: E402
from raycompat.train.export import build_model, export_model  # noqa: E402


class FreeBackbone(nn.Module):
    """``(B, C, H, W)`` -> ``(B, embed_dim)``: the per-channel mean, then a linear map."""

    def __init__(self, *, embed_dim: int = 128, in_chans: int = 3) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.proj = nn.Linear(in_chans, embed_dim)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.mean(dim=(2, 3)))


def register_free() -> None:
    """Register ``free`` in this process's backbone registry (the driver and every worker)."""
    from raycompat.nn.backbones import BACKBONES

    if "free" not in BACKBONES.names():
        BACKBONES.register("free")(FreeBackbone)


def make_images(path: str, count: int, size: int, row_group: int) -> None:
    """``count`` JPEGs of smooth random content (upsampled 8 x 8 noise) in one Parquet file."""
    rng = np.random.default_rng(0)
    encoded = []
    for _ in range(count):
        coarse = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
        buffer = io.BytesIO()
        coarse.resize((size, size), Image.Resampling.BICUBIC).save(buffer, "JPEG", quality=90)
        encoded.append(buffer.getvalue())
    table = pa.table({"id": np.arange(count, dtype=np.int64), "image": encoded})
    pq.write_table(table, path, row_group_size=row_group)


def in_child(function, *args) -> None:
    """``function(*args)`` in a fresh process, so the driver's RSS never holds what it made."""
    child = multiprocessing.get_context("spawn").Process(target=function, args=args)
    child.start()
    child.join()
    if child.exitcode:
        raise RuntimeError(f"{function.__name__} failed in a child process")


_SOURCE = None


def _open(spec: SourceSpec) -> None:
    global _SOURCE
    torch.set_num_threads(1)
    _SOURCE = open_source(spec)
    _SOURCE.image_shape()  # one image decoded: the JPEG decoder's imports are start-up too


def _decode(chunk, batch_size: int) -> tuple[int, float, float]:
    start, rows = time.time(), 0
    for ids, _, _ in _SOURCE.batches(chunk, batch_size, AUGMENTATIONS.get("none"), None, True):
        rows += len(ids)
    return rows, start, time.time()


def decode_pool(spec: SourceSpec, chunks: list, processes: int, batch_size: int) -> dict:
    """A plain pool of ``processes`` decoding every chunk: ``seconds`` from the pool's start
    (its processes importing torch and opening the source) to the last chunk, and
    ``decoding_s`` from the first chunk's start to the last one's end (its steady rate)."""
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes, initializer=_open, initargs=(spec,)) as pool:
        done = pool.starmap(_decode, [(chunk, batch_size) for chunk in chunks], chunksize=1)
    seconds = time.perf_counter() - start
    assert sum(rows for rows, _, _ in done) == sum(c.rows for c in chunks)
    decoding_s = max(end for _, _, end in done) - min(begin for _, begin, _ in done)
    return {"seconds": seconds, "decoding_s": decoding_s}


def extract(store, model_dir: str, spec: SourceSpec, run: RunOptions, dim: int, k: int) -> dict:
    info = VersionInfo(f"v{k}", "free", dim, True, f"v{k} = extract(free)")
    with DriverRSS() as rss:
        start = time.perf_counter()
        result = extract_version(store, "bench", info, model_dir, spec, run)
        seconds = time.perf_counter() - start
    shutil.rmtree(store.path("bench", f"_data/v{k}"), ignore_errors=True)
    return {
        "seconds": seconds,
        "driver_peak_rss_mb": rss.peak / 2**20,
        "model_actor_cpu_s": result["actor_cpu_s"],
    }


def bench_size(count: int, args, model_dir: str, run: RunOptions, tmp: str) -> dict:
    path = f"{tmp}/images-{count}.parquet"
    in_child(make_images, path, count, args.image_size, args.row_group)
    spec = SourceSpec(kind="parquet_images", paths=[path])
    source = open_source(spec)
    chunks = source.plan(chunk_rows(run, source.image_shape(), 1 if source.hands_uint8() else 4))
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    pools = plan_pools(run, nodes, len(chunks))
    store = GalleryStore(f"{tmp}/store-{count}")
    rounds = []
    for k in range(args.pairs):
        decode = decode_pool(spec, chunks, pools.decode_workers, run.batch_size)
        rounds.append(
            {"decode": decode, "extract": extract(store, model_dir, spec, run, args.dim, k)}
        )
        print(count, rounds[-1], flush=True)
    decode_s = statistics.median(r["decode"]["seconds"] for r in rounds)
    decoding_s = statistics.median(r["decode"]["decoding_s"] for r in rounds)
    extract_s = statistics.median(r["extract"]["seconds"] for r in rounds)
    return {
        "images": count,
        "chunks": len(chunks),
        "rows_per_chunk": chunks[0].rows,
        "pools": {"model_actors": pools.model.actors, "decode_workers": pools.decode_workers},
        "seconds": {"decode": decode_s, "decode_steady": decoding_s, "extract": extract_s},
        "images_per_s": {
            "decode": count / decode_s,
            "decode_steady": count / decoding_s,
            "extract": count / extract_s,
        },
        "extract_over_decode": decode_s / extract_s,
        "driver_peak_rss_mb": max(r["extract"]["driver_peak_rss_mb"] for r in rounds),
        "model_actor_cpu_us_per_image": 1e6
        * statistics.median(r["extract"]["model_actor_cpu_s"] for r in rounds)
        / count,
        "rounds": rounds,
    }


def summarise(runs: list[dict]) -> dict:
    small, large = runs[0], runs[-1]
    extra = large["images"] - small["images"]

    def margin(step: str) -> float:
        return extra / (large["seconds"][step] - small["seconds"][step])

    def per_image(run: dict) -> float:
        return run["seconds"]["extract"] / run["images"]

    steady = large["images_per_s"]["decode_steady"]
    return {
        "margin_images_per_s": {
            "decode": margin("decode"),
            "decode_steady": margin("decode_steady"),
            "extract": margin("extract"),
        },
        # the target (>= 0.9): both sides' fixed costs and warm-up cancel
        "margin_extract_over_decode_steady": margin("extract") / margin("decode_steady"),
        "margin_extract_over_decode": margin("extract") / margin("decode"),
        "margin_extract_over_largest_decode_steady": margin("extract") / steady,
        "extract_time_per_image_largest_over_smallest": per_image(large) / per_image(small),
        "driver_peak_rss_largest_over_smallest": large["driver_peak_rss_mb"]
        / small["driver_peak_rss_mb"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs="+", default=[2000, 6000, 16000])
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--row-group", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--dim", type=int, default=128, help="embedding width")
    parser.add_argument("--block-mib", type=int, default=128, help="run.decode_block_mib")
    parser.add_argument("--processes", type=int, default=os.cpu_count(), help="CPUs for Ray")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/extract_pipeline_cpu.json")
    args = parser.parse_args(argv)

    register_free()
    if __name__ != "__main__":  # imported (tests): workers cannot import this script by name
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        num_cpus=args.processes,
        include_dashboard=False,
        logging_level="WARNING",
        runtime_env={"worker_process_setup_hook": register_free},
    )
    results = {"machine": machine_info(), "args": dict(vars(args))}
    results["load_average_at_start"] = os.getloadavg()
    start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="extract_pipeline_", dir=os.environ.get("BENCH_TMP"))
    try:
        spec = ModelSpec(backbone="free", head="linear", num_classes=2, embed_dim=args.dim)
        torch.manual_seed(0)
        export_model(f"{tmp}/model", build_model(spec).state_dict(), spec)
        run = RunOptions(
            batch_size=args.batch_size,
            pool="auto",
            progress_every_s=60,
            decode_block_mib=args.block_mib,
        )
        # Warm-up (not measured): Ray's first pipeline pays one-off costs (workers importing
        # Ray Data, the first object-store allocations) that later runs do not.
        in_child(
            make_images,
            f"{tmp}/warmup.parquet",
            2 * args.row_group,
            args.image_size,
            args.row_group,
        )
        warmup = SourceSpec(kind="parquet_images", paths=[f"{tmp}/warmup.parquet"])
        extract(GalleryStore(f"{tmp}/warmup"), f"{tmp}/model", warmup, run, args.dim, 0)
        results["runs"] = [bench_size(n, args, f"{tmp}/model", run, tmp) for n in sorted(args.size)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["benchmark_seconds"] = time.perf_counter() - start
    results["load_average_at_end"] = os.getloadavg()
    if len(results["runs"]) >= 2:
        results["summary"] = summarise(results["runs"])
    emit(results, args.out)
    ray.shutdown()
    return results


if __name__ == "__main__":
    main()
