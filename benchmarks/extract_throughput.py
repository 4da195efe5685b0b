"""Extraction throughput: the Ray Data pipeline's images/s vs the model's raw forward rate.

    .venv/bin/python benchmarks/extract_throughput.py --images 20000 \
        --out benchmarks/results/extract_throughput_cpu.json

Model: ``cifar_resnet20`` (64-d embedding) with random weights, exported with ``export_model``.
Images: the ``synthetic`` dataset at 32 x 32 x 3, read two ways (``--sources``):

- ``synthetic``: the ``dataset`` source, each actor renders the images itself;
- ``jpeg``: the same images encoded as JPEG (quality 95) in one Parquet file, the
  ``parquet_images`` source, each actor decodes them.

``forward_only`` is ``forward_features`` on the source's images already in memory (for ``jpeg``,
the decoded pixels: the same images), same batch size, torch using ``actors x
threads_per_actor`` threads; it is measured just before and just after the pipeline and
averaged, since the machine may be shared. ``pipeline`` is ``extract_version`` end to end
(decode in actors, forward, validate, write parts, verify on publish); their ratio is the
pipeline's overhead. ``startup`` is the same pipeline on ``actors`` batches only (planning,
actor start-up with its imports and model load, publishing): ``steady`` rates leave it out.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.cluster.pipelines import RunOptions, SourceSpec, extract_version  # noqa: E402
from raycompat.config.train import ModelSpec  # noqa: E402
from raycompat.data import create_dataset, read_image  # noqa: E402
from raycompat.store import GalleryStore, VersionInfo  # noqa: E402
from raycompat.train.export import build_model, export_model  # noqa: E402


def forward_seconds(model, images: torch.Tensor, batch_size: int, threads: int) -> float:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(images), batch_size):
            model.forward_features(images[s : s + batch_size])
    seconds = time.perf_counter() - start
    torch.set_num_threads(1)
    return seconds


def jpeg_source(images: torch.Tensor, path: str, row_group: int) -> tuple[SourceSpec, torch.Tensor]:
    """The images as JPEG bytes in a Parquet file; returns the source and the decoded pixels."""
    encoded = []
    for image in images:
        array = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="JPEG", quality=95)
        encoded.append(buffer.getvalue())
    table = pa.table({"id": np.arange(len(encoded)), "image": encoded})
    pq.write_table(table, path, row_group_size=row_group)
    decoded = torch.stack([read_image(e) for e in encoded])
    return SourceSpec(kind="parquet_images", paths=[path]), decoded


def extract_seconds(store, gallery, info, model_dir, spec, run) -> float:
    start = time.perf_counter()
    extract_version(store, gallery, info, model_dir, spec, run)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--threads-per-actor", type=int, default=1)
    parser.add_argument("--sources", nargs="+", default=["synthetic", "jpeg"])
    parser.add_argument("--out", default="benchmarks/results/extract_throughput_cpu.json")
    args = parser.parse_args()
    threads = args.actors * args.threads_per_actor
    per_class = 100
    options = {
        "num_classes": args.images // per_class,
        "images_per_class": per_class,
        "image_size": 32,
        "channels": 3,
    }
    spec = ModelSpec(
        backbone="cifar_resnet20", head="linear", num_classes=options["num_classes"], embed_dim=64
    )
    load = {"before": os.getloadavg()}
    tmp = tempfile.mkdtemp(prefix="extract_bench_")
    results = {}
    try:
        torch.manual_seed(0)
        model = build_model(spec).eval()
        model_dir = f"{tmp}/model"
        export_model(model_dir, model.state_dict(), spec)
        dataset = create_dataset("synthetic", **options)
        images = torch.stack([dataset[i][0] for i in range(len(dataset))])
        n = len(images)

        import ray

        ray.init(num_cpus=threads, include_dashboard=False, logging_level="WARNING")
        store = GalleryStore(f"{tmp}/store")
        info = VersionInfo("v1", "resnet20", model.embed_dim, True, "v1 = extract(resnet20)")
        run = RunOptions(
            rows_per_file=n // (2 * args.actors),
            actors=args.actors,
            batch_size=args.batch_size,
            threads_per_actor=args.threads_per_actor,
        )
        tiny = {**options, "num_classes": args.actors, "images_per_class": args.batch_size}
        startup_run = RunOptions(
            rows_per_file=args.batch_size,
            actors=args.actors,
            batch_size=args.batch_size,
            threads_per_actor=args.threads_per_actor,
        )
        startup_s = extract_seconds(
            store,
            "startup",
            info,
            model_dir,
            SourceSpec(kind="dataset", name="synthetic", options=tiny),
            startup_run,
        )
        for name in args.sources:
            if name == "synthetic":
                source, pixels = (
                    SourceSpec(kind="dataset", name="synthetic", options=options),
                    images,
                )
            elif name == "jpeg":
                source, pixels = jpeg_source(images, f"{tmp}/images.parquet", args.batch_size)
            else:
                raise ValueError(f"unknown source {name!r}; valid: synthetic, jpeg")
            before = forward_seconds(model, pixels, args.batch_size, threads)
            pipeline_s = extract_seconds(store, name, info, model_dir, source, run)
            after = forward_seconds(model, pixels, args.batch_size, threads)
            forward_s = (before + after) / 2
            results[name] = {
                "forward_only_images_per_s": n / forward_s,
                "pipeline_images_per_s": n / pipeline_s,
                "pipeline_over_forward": forward_s / pipeline_s,
                "steady_pipeline_images_per_s": n / (pipeline_s - startup_s),
                "steady_pipeline_over_forward": forward_s / (pipeline_s - startup_s),
                "seconds": {
                    "forward_only_before": before,
                    "forward_only_after": after,
                    "pipeline": pipeline_s,
                },
            }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load["after"] = os.getloadavg()
    emit(
        {
            "machine": machine_info(),
            "load_average_1_5_15min": load,
            "args": vars(args),
            "model": "cifar_resnet20 (64-d), 32x32x3 synthetic images",
            "startup_seconds": startup_s,
            "sources": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
