"""Extraction throughput: the Ray Data pipeline's images/s vs the model's raw forward rate.

    .venv/bin/python benchmarks/extract_throughput.py --images 4000 \
        --out benchmarks/results/extract_throughput_cpu.json

Model: ``cifar_resnet20`` (64-d embedding) with random weights, exported with ``export_model``;
images: the ``synthetic`` dataset at 32 x 32 x 3. ``forward_only`` is ``forward_features`` on
tensors already in memory (same batch size, torch using ``actors x threads_per_actor``
threads); ``pipeline`` is ``extract_version`` end to end (decode in actors, forward, validate,
write parts, verify on publish). Their ratio is the pipeline's overhead.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.data import create_dataset  # noqa: E402
from raycompat.pipelines import RunOptions, SourceSpec, extract_version  # noqa: E402
from raycompat.store import GalleryStore, VersionInfo  # noqa: E402
from raycompat.train.config import ModelSpec  # noqa: E402
from raycompat.train.export import build_model, export_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--threads-per-actor", type=int, default=1)
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
    tmp = tempfile.mkdtemp(prefix="extract_bench_")
    try:
        torch.manual_seed(0)
        model = build_model(spec).eval()
        export_model(f"{tmp}/model", model.state_dict(), spec)
        dataset = create_dataset("synthetic", **options)
        images = torch.stack([dataset[i][0] for i in range(len(dataset))])
        torch.set_num_threads(threads)
        start = time.perf_counter()
        with torch.inference_mode():
            for s in range(0, len(images), args.batch_size):
                model.forward_features(images[s : s + args.batch_size])
        forward_s = time.perf_counter() - start
        torch.set_num_threads(1)

        import ray

        ray.init(num_cpus=threads, include_dashboard=False, logging_level="WARNING")
        store = GalleryStore(f"{tmp}/store")
        info = VersionInfo("v1", "resnet20", model.embed_dim, True, "v1 = extract(resnet20)")
        run = RunOptions(
            rows_per_file=len(images) // (2 * args.actors),
            actors=args.actors,
            batch_size=args.batch_size,
            threads_per_actor=args.threads_per_actor,
        )
        start = time.perf_counter()
        extract_version(
            store,
            "bench",
            info,
            f"{tmp}/model",
            SourceSpec(kind="dataset", name="synthetic", options=options),
            run,
        )
        pipeline_s = time.perf_counter() - start
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(images)
    results = {
        "machine": machine_info(),
        "args": vars(args),
        "model": "cifar_resnet20 (64-d), 32x32x3 synthetic images",
        "forward_only_images_per_s": n / forward_s,
        "pipeline_images_per_s": n / pipeline_s,
        "pipeline_over_forward": forward_s / pipeline_s,
        "seconds": {"forward_only": forward_s, "pipeline": pipeline_s},
    }
    emit(results, args.out)


if __name__ == "__main__":
    main()
