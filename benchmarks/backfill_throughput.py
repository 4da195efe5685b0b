"""Partial backfill cost vs budget, against a full re-extraction of the same gallery (issue 16).

    .venv/bin/python benchmarks/backfill_throughput.py --images 20000 \
        --out benchmarks/results/backfill_throughput_cpu.json

Gallery: ``--images`` synthetic 1x28x28 digits-like images (the ``synthetic`` dataset, rendered
in the actors), stored as version ``v1`` = LeNet++ m1's 32-d features (``extract_version``,
also timed: ``extract_old``). The upgrade: LeNet++ m2 (64-d, another seed) and an FCT h
(32 -> 64, hidden width 128, with FastFill's uncertainty head; random weights: the cost does not
depend on what h learned). Each partial backfill (``partial_backfill_version``, order
``uncertainty``) writes its own version from ``v1``; ``full`` is ``extract_version`` of the same
images with m2, the baseline a partial backfill saves against. All runs share one local Ray
(``--actors`` x 1 thread) and the same ``RunOptions``.

The wall time of a partial backfill is fitted as ``a + s * [0 < budget < 1] + b * budget``
(least squares over the budgets run): ``a`` is the fixed part (actor start-up, reading v1, h,
writing, publishing), ``s`` the selection pass that only budgets strictly between 0 and 1 need
(key actors, Ray Data sort), ``b`` the cost of re-extracting the whole gallery inside the
backfill, to compare with ``full``. ``fit_interior`` is the plain ``a + b * budget`` fit over the
budgets strictly between 0 and 1 (its ``a`` includes ``s``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.cluster.pipelines import (  # noqa: E402
    RunOptions,
    SourceSpec,
    extract_version,
    partial_backfill_version,
)
from raycompat.config.train import ModelSpec  # noqa: E402
from raycompat.store import GalleryStore, VersionInfo  # noqa: E402
from raycompat.train.export import build_model, export_model  # noqa: E402
from raycompat.transformations import FCTTransformation, save_transformation  # noqa: E402

D_OLD, D_NEW, WIDTH = 32, 64, 128


def lenet(directory: str, embed_dim: int, classes: int, seed: int) -> str:
    spec = ModelSpec(
        backbone="lenetpp",
        head="linear",
        num_classes=classes,
        embed_dim=embed_dim,
        backbone_kwargs={"in_chans": 1, "image_size": 28},
    )
    torch.manual_seed(seed)
    export_model(directory, build_model(spec).state_dict(), spec)
    return directory


def uncertain_h(directory: str) -> str:
    torch.manual_seed(0)
    h = FCTTransformation(D_OLD, 0, D_NEW, WIDTH, normalize_output=True, uncertainty=True)
    for m in h.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    save_transformation(directory, h, "h")
    return directory


def timed(fn, *args, **kwargs) -> tuple[float, dict]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.0, 0.1, 0.3, 0.6, 1.0])
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--rows-per-file", type=int, default=2500)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/backfill_throughput_cpu.json")
    args = parser.parse_args()
    per_class = 100
    classes = args.images // per_class
    images = SourceSpec(
        kind="dataset",
        name="synthetic",
        options={
            "num_classes": classes,
            "images_per_class": per_class,
            "image_size": 28,
            "channels": 1,
        },
    )
    run = RunOptions(
        rows_per_file=args.rows_per_file,
        batch_size=args.batch_size,
        actors=args.actors,
        progress_every_s=30,
    )
    n = classes * per_class
    load = {"before": os.getloadavg()}
    tmp = tempfile.mkdtemp(prefix="backfill_bench_")
    try:
        m1 = lenet(f"{tmp}/m1", D_OLD, classes, seed=1)
        m2 = lenet(f"{tmp}/m2", D_NEW, classes, seed=2)
        h = uncertain_h(f"{tmp}/h")

        import ray

        ray.init(num_cpus=args.actors, include_dashboard=False, logging_level="WARNING")
        store = GalleryStore(f"{tmp}/store")
        old = VersionInfo("v1", "m1", D_OLD, True, "v1 = extract(m1)")
        extract_old_s, _ = timed(extract_version, store, "g", old, m1, images, run)
        partial = {}
        for budget in args.budgets:
            target = VersionInfo(f"b{round(budget * 100):03d}", "m2", D_NEW, True, "-")
            seconds, result = timed(
                partial_backfill_version,
                store,
                "g",
                "v1",
                target,
                h,
                m2,
                images,
                budget,
                options=run,
            )
            partial[str(budget)] = {
                "seconds": seconds,
                "rows_per_s": n / seconds,
                "extracted": result["extracted"],
                "selection_seconds": result["selection_seconds"],
                "write_seconds": result["seconds"],
            }
            print(f"budget {budget}: {seconds:.1f} s", file=sys.stderr, flush=True)
        full = VersionInfo("full", "m2", D_NEW, True, "full = extract(m2)")
        full_s, _ = timed(extract_version, store, "g", full, m2, images, run)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load["after"] = os.getloadavg()
    budgets = np.array(args.budgets)
    seconds = np.array([partial[str(b)]["seconds"] for b in args.budgets])
    interior = (budgets > 0) & (budgets < 1)
    design = np.stack([np.ones_like(budgets), interior.astype(float), budgets], axis=1)
    (a, s, b), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    fitted = design @ np.array([a, s, b])
    b_in, a_in = np.polyfit(budgets[interior], seconds[interior], 1)
    for entry, fit in zip(partial.values(), fitted, strict=True):
        entry["over_full_extraction"] = entry["seconds"] / full_s
        entry["fit_seconds"] = fit
    emit(
        {
            "machine": machine_info(),
            "load_average_1_5_15min": load,
            "args": vars(args),
            "gallery": f"{n} synthetic 1x28x28 images; v1 = LeNet++ m1 (32-d) features",
            "upgrade": "LeNet++ m2 (64-d); h: FCT 32 -> 64, width 128, uncertainty head",
            "rows": n,
            "extract_old": {"seconds": extract_old_s, "rows_per_s": n / extract_old_s},
            "full_extraction": {"seconds": full_s, "rows_per_s": n / full_s},
            "partial_backfill": partial,
            "fit_seconds_a_plus_s_selection_plus_b_budget": {
                "a": a,
                "s": s,
                "b": b,
                "a_over_full": a / full_s,
                "b_over_full": b / full_s,
                "max_abs_residual_s": float(np.abs(seconds - fitted).max()),
            },
            "fit_interior_a_plus_b_budget": {
                "a": a_in,
                "b": b_in,
                "max_abs_residual_s": float(
                    np.abs(seconds[interior] - (a_in + b_in * budgets[interior])).max()
                ),
            },
        },
        args.out,
    )


if __name__ == "__main__":
    main()
