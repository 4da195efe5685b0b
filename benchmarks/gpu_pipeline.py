"""The project's training, extraction and transform on one GPU node, each beside a plain ceiling.

    PYTHONPATH=/tmp/site:$PWD python benchmarks/gpu_pipeline.py --size full --device cuda \
        --out benchmarks/results/gpu_pipeline_<device>.json

Issue 38, item 5. Every figure goes through the project's public entry points, as a new user
runs them, with a plain PyTorch / pyarrow ceiling measured in the same run (medians of timed
windows, ``gpu_check.timed_rate``):

1. ``training``: ``raycompat-train``'s ``main`` on a YAML config (ResNet-50 + d-Simplex head,
   K = 100 synthetic identities at 112 px, batch 256, bf16, channels_last, 1 GPU worker, ddp,
   ``data.num_loader_workers`` unset: the worker's CPUs but one decode). The rate is the median
   ``images_per_s`` of the run's ``metrics.jsonl`` over epochs >= 1 (epoch 0 holds cuDNN's
   autotuning and the loader's start). Ceiling: the same model (``build_model`` of the same
   spec) stepped on one batch already on the GPU (SGD, bf16 autocast, channels_last), with
   ``cudnn.benchmark`` on, and off as the project's loop runs it.
2. ``extraction``: ``extract_version`` (``pool: auto``) of a random-init DINOv3 ViT-B/16
   (``dinov3_vitb16``, 768-d, 112 px) over synthetic images, against the smaller of (a) its
   forward-only rate on a batch already on the GPU and (b) the node's decode rate: the same
   synthetic images rendered by one process per CPU (``dataset.batch``, as the decode workers
   call it), one thread each.
3. ``transform``: ``transform_version`` (``pool: auto``) of a stored version (N x 128-d
   embedding + 128-d side info) through FCT h and g of width 2048, against the raw Parquet
   read + write of the same files by one plain pyarrow process per CPU. Also reported, not
   in the ratio: h and g alone on rows already on the GPU.

Extraction and transform run twice, at ``*_small`` and at the full size: the steady rate is the
margin between them (``(N - n) / (t - t_small)``: planning, actor start-up and publishing
cancel), the end-to-end rate is the full run's. The ratio is the steady one where both ran.
Each section is isolated: an error is recorded in its entry (with what it measured before) and
the next section runs; a section that would start past ``--budget-s`` is skipped; ``--out`` is
rewritten after each section (``"complete": false`` until the end), so a run stopped by a time
limit keeps what it finished. Progress lines go to stderr, the JSON to stdout and ``--out``.
``--size tiny --device cpu`` is the CPU smoke test (``tests/benchmarks/test_gpu_pipeline.py``);
how to bring Ray to a GPU image that lacks it: benchmarks/README.md, "GPU pipeline".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402
from gpu_check import (  # noqa: E402
    autocast,
    peak_memory_mb,
    resolve_device,
    start_memory,
    timed_rate,
)

TARGET = 0.8  # every section: ours / ceiling
D = 128  # transform: embedding and side-info width
GALLERY = "bench"
EXTRACT_CLASSES = 100  # the extraction model's (unused) head; images are drawn over as many

log = logging.getLogger("gpu_pipeline")


@dataclass(frozen=True)
class Sizes:
    image_size: int
    train_backbone: str
    train_classes: int  # K of the d-Simplex head, and of the synthetic identities
    train_images_per_class: int
    train_batch: int
    epochs: int  # >= 2: epoch 0 is left out of the rate
    extract_backbone: str
    extract_images: int
    extract_small: int  # 0: no start-up run, the steady rate is not measured
    extract_batch: int
    decode_images: int  # rendered by the decode baseline
    transform_rows: int
    transform_small: int  # 0: as extract_small
    rows_per_file: int  # the source's files, and the transform's parts
    fct_width: int
    transform_batch: int
    warmup: int  # ceilings: untimed steps, then windows of iterations
    windows: int
    iterations: int


SIZES = {
    # CPU smoke test: seconds of work on 2 cores, the rest is Ray's start-up.
    "tiny": Sizes(
        image_size=32,
        train_backbone="resnet18",
        train_classes=10,
        train_images_per_class=20,
        train_batch=8,
        epochs=2,
        extract_backbone="dinov3_vits16",
        extract_images=40,
        extract_small=0,
        extract_batch=8,
        decode_images=32,
        transform_rows=1_000,
        transform_small=0,
        rows_per_file=1_000,
        fct_width=16,
        transform_batch=1_024,
        warmup=1,
        windows=2,
        iterations=2,
    ),
    # One H100 / H200 with 16 CPUs: about 3 minutes in all (benchmarks/README.md).
    "full": Sizes(
        image_size=112,
        train_backbone="resnet50",
        train_classes=100,
        train_images_per_class=400,
        train_batch=256,
        epochs=3,
        extract_backbone="dinov3_vitb16",
        extract_images=60_000,
        extract_small=12_000,
        extract_batch=256,
        decode_images=16_384,
        transform_rows=2_000_000,
        transform_small=500_000,
        rows_per_file=62_500,
        fct_width=2048,
        transform_batch=65_536,
        warmup=10,
        windows=5,
        iterations=10,
    ),
}


@dataclass
class Context:
    """What every section gets: the device, the sizes, a scratch folder, the node's CPUs."""

    device: torch.device
    sizes: Sizes
    workdir: Path
    processes: int  # baselines: one process per CPU of the node
    ray_cpus: int  # what Ray sees (a test's Ray may differ from the machine)

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device.type == "cuda" else torch.float32


def steady_rate(small: int, small_s: float | None, full: int, full_s: float) -> float | None:
    """Items per second at the margin between a run of ``small`` and one of ``full`` items
    (what each further item costs once the fixed costs are paid); None without a usable pair."""
    if not small or small_s is None or full <= small or full_s <= small_s:
        return None
    return (full - small) / (full_s - small_s)


def paired_runs(run: Callable[[str, int], float], small: int, full: int) -> dict:
    """``run(name, items) -> seconds`` at ``small`` (if any) then ``full``: both rates."""
    small_s = run("small", small) if small else None
    full_s = run("full", full)
    return {
        "items": full,
        "seconds": full_s,
        "small_items": small or None,
        "small_seconds": small_s,
        "end_to_end_per_s": full / full_s,
        "steady_per_s": steady_rate(small, small_s, full, full_s),
    }


def ratios(pipeline: dict, bound: float) -> dict:
    """The headline ``ratio`` (steady where measured, else end to end) against ``bound``."""
    steady = pipeline["steady_per_s"]
    out = {"end_to_end_ratio": pipeline["end_to_end_per_s"] / bound}
    out["steady_ratio"] = steady / bound if steady is not None else None
    out["ratio_from"] = "steady" if steady is not None else "end_to_end"
    out["ratio"] = out["steady_ratio"] if steady is not None else out["end_to_end_ratio"]
    out["target"], out["meets_target"] = TARGET, out["ratio"] >= TARGET
    return out


def ceiling_timing(s: Sizes) -> argparse.Namespace:
    """The ``warmup``/``windows`` that ``gpu_check.timed_rate`` reads."""
    return argparse.Namespace(warmup=s.warmup, windows=s.windows)


def measured(step, items: int, ctx: Context) -> dict:
    """``gpu_check.timed_rate`` of ``step`` on ``items`` per step, ``per_s`` its median."""
    s = ctx.sizes
    rate = timed_rate(step, items, ctx.device, ceiling_timing(s), s.iterations)
    return {"per_s": rate.pop("median"), **rate, "peak_gpu_memory_mb": peak_memory_mb(ctx.device)}


# --- 1. training ------------------------------------------------------------------------------


def training_config(ctx: Context) -> dict:
    """The YAML a user writes for this run (configs/train_casia_cores.yaml's keys)."""
    s, gpu = ctx.sizes, ctx.device.type == "cuda"
    synthetic = {
        "num_classes": s.train_classes,
        "images_per_class": s.train_images_per_class,
        "image_size": s.image_size,
        "channels": 3,
        "seed": 0,
    }
    return {
        "method": "independent",
        "model": {"backbone": s.train_backbone, "head": "dsimplex", "num_classes": s.train_classes},
        "data": {"name": "synthetic", "options": synthetic, "loader": "sampler"},
        # at least two test and two validation images per identity (1:N identification)
        "eval": {"protocol": "identification", "test_fraction": 0.1, "val_fraction": 0.1},
        "optim": {
            "name": "sgd",
            "lr": 0.1,
            "momentum": 0.9,
            "weight_decay": 5.0e-4,
            "schedule": "constant",
        },
        "scenario": {"kind": "cores", "tasks": [s.train_classes]},
        # the node's CPUs but two (the driver, Ray): all but one of them decode
        "scaling": {
            "num_workers": 1,
            "use_gpu": gpu,
            "cpus_per_worker": max(1, ctx.ray_cpus - 2),
            "strategy": "ddp",
            "precision": "bf16",
            "channels_last": True,
        },
        "run": {
            "name": "gpu-pipeline-train",
            "storage_path": str(ctx.workdir / "runs"),
            "checkpoints_to_keep": 1,
            "max_failures": 0,
        },
        "epochs": s.epochs,
        "batch_size": s.train_batch,
    }


def train_ceiling(spec, ctx: Context) -> dict:
    """img/s of SGD steps of ``build_model(spec)`` on one batch already on the device."""
    from raycompat.train.export import build_model

    s, device = ctx.sizes, ctx.device
    start_memory(device)
    torch.manual_seed(0)
    model = build_model(spec).to(device, memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    images = torch.rand(s.train_batch, 3, s.image_size, s.image_size, device=device)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, spec.num_classes, (s.train_batch,), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, ctx.dtype):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    return measured(step, s.train_batch, ctx)


def train_ceilings(spec, ctx: Context) -> dict:
    """The ceiling with cuDNN's autotuner (the best plain PyTorch does) and, on CUDA, without
    it, as the project's loop runs (it leaves ``cudnn.benchmark`` at its default, off)."""
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        out = {"cudnn_benchmark": train_ceiling(spec, ctx)}
        if ctx.device.type == "cuda":
            torch.backends.cudnn.benchmark = False
            out["cudnn_default"] = train_ceiling(spec, ctx)
    finally:
        torch.backends.cudnn.benchmark = before
        start_memory(ctx.device)  # the job's worker gets the GPU's memory back
    return out


def epoch_metrics(path: Path) -> list[dict]:
    """Each epoch's last report in ``metrics.jsonl`` (a retried epoch appears again)."""
    epochs = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        epochs[entry["epoch"]] = entry
    return [epochs[k] for k in sorted(epochs)]


def training(ctx: Context, out: dict) -> None:
    from raycompat.cli.jobs.train import main as train_job
    from raycompat.config import load_config
    from raycompat.config.train import TrainConfig

    out["config"] = config = training_config(ctx)
    path = ctx.workdir / "train.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cfg = load_config(TrainConfig, path)
    out["loader_workers_per_gpu_worker"] = max(0, int(cfg.scaling.cpus_per_worker) - 1)
    log.info("training: ceiling (%s, batch %d)", cfg.model.backbone, cfg.batch_size)
    out["ceiling"] = ceilings = train_ceilings(cfg.model, ctx)
    log.info("training: the job, %d epochs", cfg.epochs)
    start = time.perf_counter()
    train_job(["--config", str(path)])
    out["job_seconds"] = time.perf_counter() - start
    epochs = epoch_metrics(Path(cfg.run.storage_path) / cfg.run.name / "metrics.jsonl")
    out["epochs"] = [
        {k: e.get(k) for k in ("epoch", "images_per_s", "seconds", "steps")} for e in epochs
    ]
    out["images_per_s"] = rate = statistics.median(
        e["images_per_s"] for e in epochs if e["epoch"] >= 1
    )
    if "cudnn_default" in ceilings:
        out["ratio_cudnn_default"] = rate / ceilings["cudnn_default"]["per_s"]
    out["ratio"] = rate / ceilings["cudnn_benchmark"]["per_s"]
    out["target"], out["meets_target"] = TARGET, out["ratio"] >= TARGET


# --- 2. extraction ----------------------------------------------------------------------------


def synthetic_options(images: int, image_size: int) -> dict:
    classes = min(EXTRACT_CLASSES, images)
    if images % classes:
        raise ValueError(f"extraction images ({images}) must be a multiple of {classes}")
    return {
        "num_classes": classes,
        "images_per_class": images // classes,
        "image_size": image_size,
        "channels": 3,
        "seed": 1,
    }


# One decode process: the synthetic images of rows [start, stop), as the decode workers call it.
DECODE_PROCESS = """
import json, sys
import numpy as np
import torch
from raycompat.data import create_dataset
options, batch_size, start, stop = json.loads(sys.argv[1]), *map(int, sys.argv[2:5])
torch.set_num_threads(1)
dataset = create_dataset("synthetic", **options)
print("ready", flush=True)
sys.stdin.readline()
for first in range(start, stop, batch_size):
    dataset.batch(np.arange(first, min(first + batch_size, stop)))
"""

# One raw process: its files, batch by batch, written back with ParquetWriter's defaults.
RAW_PROCESS = """
import sys
import pyarrow.parquet as pq
out, batch_size, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("ready", flush=True)
sys.stdin.readline()
for path in files:
    parquet = pq.ParquetFile(path)
    with pq.ParquetWriter(out + "/" + path.rsplit("/", 1)[1], parquet.schema_arrow) as writer:
        for batch in parquet.iter_batches(batch_size=batch_size):
            writer.write_batch(batch)
"""


def timed_processes(script: str, argvs: list[list[str]]) -> float:
    """Seconds from "go" to the last exit of one ``python -c script`` per argv, each started
    with one BLAS / OpenMP thread (as Ray starts a 1-CPU worker) and ready, its imports done,
    before the clock starts."""
    single = {n: "1" for n in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **single, "PYTHONPATH": path}
    command = [sys.executable, "-c", script]
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    processes = [subprocess.Popen([*command, *argv], **pipes) for argv in argvs]
    try:
        for process in processes:
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a baseline process exited with {process.wait()}")
        start = time.perf_counter()
        for process in processes:
            process.stdin.close()  # go
        if any(process.wait() for process in processes):
            raise RuntimeError(f"a baseline process failed: {[p.returncode for p in processes]}")
        return time.perf_counter() - start
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def decode_rate(options: dict, ctx: Context) -> dict:
    """Images/s that one process per CPU renders, each its share of the images."""
    s, processes = ctx.sizes, ctx.processes
    images = min(s.decode_images, options["num_classes"] * options["images_per_class"])
    bounds = np.linspace(0, images, processes + 1).astype(int)
    argvs = [
        [json.dumps(options), str(s.extract_batch), str(a), str(b)]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    seconds = timed_processes(DECODE_PROCESS, argvs)
    return {
        "per_s": images / seconds,
        "images": images,
        "seconds": seconds,
        "processes": processes,
        "batch_size": s.extract_batch,
    }


def forward_ceiling(model, ctx: Context) -> dict:
    """img/s of ``forward_features`` on one batch already on the device (inference)."""
    s, device = ctx.sizes, ctx.device
    start_memory(device)
    model = model.to(device).eval()
    images = torch.rand(s.extract_batch, 3, s.image_size, s.image_size, device=device)

    def step():
        with torch.inference_mode(), autocast(device, ctx.dtype):
            model.forward_features(images)

    try:
        return measured(step, s.extract_batch, ctx)
    finally:
        model.to("cpu")
        start_memory(device)


def extraction(ctx: Context, out: dict) -> None:
    from raycompat.cluster.pipelines import RunOptions, SourceSpec, extract_version
    from raycompat.config.train import ModelSpec
    from raycompat.store import GalleryStore, VersionInfo
    from raycompat.train.export import build_model, export_model

    s = ctx.sizes
    spec = ModelSpec(
        backbone=s.extract_backbone,
        head="linear",
        num_classes=EXTRACT_CLASSES,
        backbone_kwargs={"img_size": s.image_size},
    )
    out["model"] = asdict(spec)
    torch.manual_seed(0)
    model = build_model(spec)
    out["embed_dim"] = model.embed_dim
    model_dir = ctx.workdir / "extract_model"
    export_model(model_dir, model.state_dict(), spec, step="gpu_pipeline")
    log.info("extraction: forward-only ceiling (%s)", spec.backbone)
    out["forward_only"] = forward = forward_ceiling(model, ctx)
    log.info("extraction: decode baseline, %d processes", ctx.processes)
    out["decode"] = decode = decode_rate(synthetic_options(s.extract_images, s.image_size), ctx)
    out["bound"] = "forward_only" if forward["per_s"] <= decode["per_s"] else "decode"
    out["bound_per_s"] = bound = min(forward["per_s"], decode["per_s"])
    store = GalleryStore(str(ctx.workdir / "extract_store"))
    run = RunOptions(batch_size=s.extract_batch, pool="auto")
    out["run"] = asdict(run)

    def extract(name: str, images: int) -> float:
        log.info("extraction: extract_version of %d images", images)
        source = SourceSpec(name="synthetic", options=synthetic_options(images, s.image_size))
        target = VersionInfo(
            name, spec.backbone, model.embed_dim, True, f"{name} = extract({spec.backbone})"
        )
        start = time.perf_counter()
        extract_version(store, GALLERY, target, str(model_dir), source, run)
        return time.perf_counter() - start

    out["pipeline"] = pipeline = paired_runs(extract, s.extract_small, s.extract_images)
    out.update(ratios(pipeline, bound))


# --- 3. transform -----------------------------------------------------------------------------


def publish_source(root: Path, rows: int, rows_per_file: int):
    """A published version of ``rows`` x (128-d embedding, 128-d side info) in files of
    ``rows_per_file`` rows, through the store API, as ``transform_throughput.make_source``
    writes it, except that one random block serves every file: drawing fresh rows per file
    would cost about what the transform measured costs."""
    from raycompat.store import GalleryStore, VersionInfo, embedding_table

    store = GalleryStore(str(root))
    info = VersionInfo("v1", "m1", D, False, "v1 = extract(m1)", side_info_width=D)
    staging = store.begin(GALLERY, info, "source")
    block = np.random.default_rng(0).standard_normal((rows_per_file, 2 * D), dtype=np.float32)
    for k, start in enumerate(range(0, rows, rows_per_file)):
        n = min(rows_per_file, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        table = embedding_table(ids, block[:n, :D], block[:n, D:])
        staging.write_table(table, f"in-{k:05d}.parquet")
    staging.commit(expected_rows=rows)
    return store


def raw_parquet_rate(files: list[str], out_dir: Path, ctx: Context) -> dict:
    """Rows/s of one plain pyarrow process per CPU reading and rewriting its share of
    ``files``."""
    out_dir.mkdir(parents=True)
    shares = [files[k :: ctx.processes] for k in range(ctx.processes)]
    argvs = [[str(out_dir), str(ctx.sizes.transform_batch), *share] for share in shares if share]
    seconds = timed_processes(RAW_PROCESS, argvs)
    shutil.rmtree(out_dir, ignore_errors=True)
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return {
        "per_s": rows / seconds,
        "rows": rows,
        "seconds": seconds,
        "files": len(files),
        "processes": len(argvs),
    }


def transform_compute(h, g, ctx: Context) -> dict:
    """Rows/s of h and g on one batch of rows already on the device (not in the ratio)."""
    s, device = ctx.sizes, ctx.device
    start_memory(device)
    h, g = h.to(device).eval(), g.to(device).eval()
    old = torch.randn(s.transform_batch, D, device=device)
    side = torch.randn(s.transform_batch, D, device=device)

    def step():
        with torch.inference_mode(), autocast(device, ctx.dtype):
            h(old, side)
            g(old, side)

    try:
        return measured(step, s.transform_batch, ctx)
    finally:
        h.to("cpu")
        g.to("cpu")
        start_memory(device)


def transform(ctx: Context, out: dict) -> None:
    from raycompat.cluster.pipelines import RunOptions, transform_version
    from raycompat.store import VersionInfo
    from raycompat.transformations import (
        FCTTransformation,
        save_transformation,
        side_info_transformation,
    )

    s = ctx.sizes
    torch.manual_seed(0)
    h = FCTTransformation(D, D, D, width=s.fct_width)
    g = side_info_transformation(D, D, D, width=s.fct_width)
    fct_dir = ctx.workdir / "fct"
    save_transformation(fct_dir, h, "h")
    save_transformation(fct_dir, g, "g")
    out["fct_width"], out["rows_per_file"] = s.fct_width, s.rows_per_file
    log.info("transform: h and g alone (width %d)", s.fct_width)
    out["compute"] = transform_compute(h, g, ctx)
    sizes = {"small": s.transform_small, "full": s.transform_rows}
    log.info("transform: publishing the source version(s) %s", sizes)
    start = time.perf_counter()
    stores = {
        k: publish_source(ctx.workdir / f"source_{k}", n, s.rows_per_file)
        for k, n in sizes.items()
        if n
    }
    out["source_seconds"] = time.perf_counter() - start
    full = stores["full"]
    files = [full.path(GALLERY, f) for f in full.version(GALLERY, "v1").files]
    out["parquet_mb"] = sum(os.path.getsize(f) for f in files) / 1e6
    log.info("transform: raw Parquet baseline, %d processes", ctx.processes)
    out["raw_parquet"] = raw = raw_parquet_rate(files, ctx.workdir / "raw", ctx)
    run = RunOptions(rows_per_file=s.rows_per_file, batch_size=s.transform_batch, pool="auto")
    out["run"] = asdict(run)
    target = VersionInfo("v2", "m2", D, False, "v2 = h(v1)", side_info_width=D)

    def transform_rows(name: str, rows: int) -> float:
        log.info("transform: transform_version of %d rows", rows)
        start = time.perf_counter()
        transform_version(stores[name], GALLERY, "v1", target, str(fct_dir), str(fct_dir), run)
        return time.perf_counter() - start

    out["pipeline"] = pipeline = paired_runs(transform_rows, s.transform_small, s.transform_rows)
    out.update(ratios(pipeline, raw["per_s"]))


# --- the run ----------------------------------------------------------------------------------

SECTIONS = {"training": training, "extraction": extraction, "transform": transform}


def run_section(name: str, ctx: Context) -> dict:
    """The section's entry: what it measured, and its ``error`` if it failed on the way (what
    it measured before stays); the next section runs either way."""
    log.info("%s: start", name)
    start, out = time.perf_counter(), {}
    try:
        SECTIONS[name](ctx, out)
    except Exception as error:  # noqa: BLE001 - recorded in the JSON, the run goes on
        log.exception("%s failed", name)
        first = next(iter(str(error).strip().splitlines()), "")
        out["error"] = f"{type(error).__name__}: {first}"[:500]
        out["traceback"] = traceback.format_exc()[-4000:]
    out["section_seconds"] = time.perf_counter() - start
    log.info("%s: done in %.1f s, ratio %s", name, out["section_seconds"], out.get("ratio"))
    return out


def start_ray(device: torch.device) -> dict:
    """Ray started for this node (or the one already running: a test's), quieted as the jobs
    do; what it sees."""
    import ray

    from raycompat.cluster.console import init_ray

    started = not ray.is_initialized()
    if started:
        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        ray.init(num_gpus=gpus, include_dashboard=False, log_to_driver=True)
    init_ray(None)  # log levels and Ray Data's progress bars, as the jobs set them
    resources = ray.cluster_resources()
    return {
        "started_here": started,
        "version": ray.__version__,
        "cpus": int(resources.get("CPU", 0)),
        "gpus": resources.get("GPU", 0.0),
    }


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument(
        "--budget-s",
        type=float,
        default=270.0,
        help="skip a section that would start later than this",
    )
    parser.add_argument("--workdir", default=None, help="scratch folder (default: temporary)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    return parser.parse_args(argv), parser


def quiet_console() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("[gpu_pipeline %(relativeCreated)6.0f ms] %(message)s")
        )
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def save_so_far(result: dict, out: str | None) -> None:
    """The sections finished so far (``"complete": false``) into ``out``: a run stopped by the
    device's time limit keeps them."""
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({**result, "complete": False}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> dict:
    args, parser = parse_args(argv)
    device = resolve_device(args.device, parser)
    quiet_console()
    began = time.perf_counter()
    result = {
        "benchmark": "gpu_pipeline",
        "device": str(device),
        "machine": machine_info(),
        "args": vars(args),
        "sizes": asdict(SIZES[args.size]),
        "load_average_at_start": os.getloadavg(),
    }
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_pipeline_"))
    try:
        result["ray"] = start_ray(device)
    except Exception as error:  # noqa: BLE001 - every section then records its own error
        log.exception("ray failed to start")
        result["ray"] = {"error": f"{type(error).__name__}: {error}"[:500]}
    cpus = os.cpu_count() or 1
    ctx = Context(device, SIZES[args.size], workdir, cpus, result["ray"].get("cpus", cpus))
    try:
        result["sections"] = {}
        for name in args.sections:
            elapsed = time.perf_counter() - began
            if elapsed > args.budget_s:
                result["sections"][name] = {"skipped": f"{elapsed:.0f} s > --budget-s"}
                continue
            result["sections"][name] = run_section(name, ctx)
            save_so_far(result, args.out)
    finally:
        if result["ray"].get("started_here"):
            import ray

            ray.shutdown()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    result["ratios"] = {k: v.get("ratio") for k, v in result.get("sections", {}).items()}
    result["seconds"] = time.perf_counter() - began
    result["complete"] = True
    result["load_average_at_end"] = os.getloadavg()
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
