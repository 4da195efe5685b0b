"""GPU readiness check: the three compute kernels of the project, timed on one device.

    python benchmarks/gpu_check.py --device cuda --sizes full \
        --out benchmarks/results/gpu_check_<device>.json

Needs only torch, torchvision and timm (no Ray, faiss or pyarrow), so it runs on a bare GPU
image; of raycompat it imports only the leaf module ``raycompat.transformations.fct`` (plain torch).
Measurements, all on synthetic tensors already on the device (no data loading, no
host-to-device copies):
- ``resnet50_train``: torchvision ResNet-50 (random init), channels_last, SGD step on
  cross-entropy, img/s; eager, and under ``torch.compile`` unless ``--skip-compile``.
- ``vit_b16_inference``: timm ``vit_base_patch16_224`` (random init) forward, img/s.
- ``fct_transform``: the FCT h MLP (``FCTTransformation(d, d, d, width=...)``) forward over
  (N, d) old embeddings + (N, d) side-information in batches, rows/s.
bf16 autocast on CUDA, fp32 on CPU. Each rate is the median over ``windows`` timed windows of
``iterations`` steps, after ``warmup`` untimed steps (which include compilation). On CUDA each
measurement also reports ``torch.cuda.max_memory_allocated`` since its model was built.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.transformations.fct import FCTTransformation  # noqa: E402

NUM_CLASSES = 1000  # ImageNet heads of both reference models


@dataclass(frozen=True)
class Sizes:
    image_size: int
    train_batch: int
    infer_batch: int
    fct_dim: int  # d_old = d_side = d_new
    fct_width: int
    fct_batch: int
    fct_batches: int  # batches per window: N = fct_batch * fct_batches rows
    warmup: int
    iterations: int
    windows: int


SIZES = {
    # CPU smoke test: seconds on 2 cores.
    "tiny": Sizes(32, 2, 2, 32, 64, 128, 4, 1, 2, 1),
    # One H100: the paper's FCT width 2048 on 128-d embeddings (benchmarks/README.md projection).
    "full": Sizes(224, 256, 256, 128, 2048, 65536, 16, 10, 20, 5),
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def start_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def timed_rate(step, items_per_step: int, device: torch.device, s: Sizes, iterations: int) -> dict:
    """Run ``step`` ``s.warmup`` times untimed, then ``s.windows`` windows of ``iterations``."""
    start = time.perf_counter()
    for _ in range(s.warmup):
        step()
    synchronize(device)
    warmup_s = time.perf_counter() - start
    rates = []
    for _ in range(s.windows):
        start = time.perf_counter()
        for _ in range(iterations):
            step()
        synchronize(device)
        rates.append(items_per_step * iterations / (time.perf_counter() - start))
    return {
        "warmup": s.warmup,
        "warmup_s": warmup_s,
        "iterations": iterations,
        "windows": s.windows,
        "median": statistics.median(rates),
        "window_rates": rates,
    }


def autocast(device: torch.device, dtype: torch.dtype):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)


def resnet50_train(device: torch.device, dtype: torch.dtype, s: Sizes, compile_: bool) -> dict:
    """img/s of full SGD training steps (forward, backward, update) on one synthetic batch."""
    start_memory(device)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None, num_classes=NUM_CLASSES)
    model = model.to(device, memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    images = torch.randn(s.train_batch, 3, s.image_size, s.image_size, device=device)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, NUM_CLASSES, (s.train_batch,), device=device)
    forward = torch.compile(model) if compile_ else model

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            loss = F.cross_entropy(forward(images), labels)
        loss.backward()
        optimizer.step()

    rate = timed_rate(step, s.train_batch, device, s, s.iterations)
    return {"img_per_s": rate.pop("median"), **rate, "peak_gpu_memory_mb": peak_memory_mb(device)}


def resnet50_compiled(device: torch.device, dtype: torch.dtype, s: Sizes) -> dict | str:
    """The compiled run, or ``"failed: <reason>"``: compile support varies by platform."""
    try:
        return resnet50_train(device, dtype, s, compile_=True)
    except Exception as error:  # noqa: BLE001 - any backend error means "compile unavailable"
        first_line = next(iter(str(error).strip().splitlines()), "")
        return f"failed: {type(error).__name__}: {first_line}"[:300]
    finally:
        torch._dynamo.reset()


def vit_b16_inference(device: torch.device, dtype: torch.dtype, s: Sizes) -> dict:
    start_memory(device)
    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=s.image_size)
    model = model.to(device).eval()
    images = torch.randn(s.infer_batch, 3, s.image_size, s.image_size, device=device)

    def step():
        with torch.inference_mode(), autocast(device, dtype):
            model(images)

    rate = timed_rate(step, s.infer_batch, device, s, s.iterations)
    return {"img_per_s": rate.pop("median"), **rate, "peak_gpu_memory_mb": peak_memory_mb(device)}


def fct_transform(device: torch.device, dtype: torch.dtype, s: Sizes) -> dict:
    """rows/s of h(old, side) in eval mode over N rows, one batch per step, one pass per window."""
    start_memory(device)
    torch.manual_seed(0)
    h = FCTTransformation(s.fct_dim, s.fct_dim, s.fct_dim, width=s.fct_width).to(device).eval()
    rows = s.fct_batch * s.fct_batches
    old = torch.randn(rows, s.fct_dim, device=device)
    side = torch.randn(rows, s.fct_dim, device=device)
    batches = itertools.cycle(range(0, rows, s.fct_batch))

    def step():
        start = next(batches)
        with torch.inference_mode(), autocast(device, dtype):
            h(old[start : start + s.fct_batch], side[start : start + s.fct_batch])

    rate = timed_rate(step, s.fct_batch, device, s, s.fct_batches)
    return {
        "rows_per_s": rate.pop("median"),
        "rows": rows,
        "d_old": s.fct_dim,
        "d_side": s.fct_dim,
        "d_new": s.fct_dim,
        "width": s.fct_width,
        **rate,
        "peak_gpu_memory_mb": peak_memory_mb(device),
    }


def resolve_device(name: str, parser: argparse.ArgumentParser) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    return torch.device(name)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--sizes", choices=sorted(SIZES), default="full")
    parser.add_argument("--skip-compile", action="store_true", help="no torch.compile run")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    device = resolve_device(args.device, parser)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    s = SIZES[args.sizes]
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    common = {"device": str(device), "dtype": str(dtype).removeprefix("torch.")}

    image = {**common, "image_size": s.image_size}
    train = {**image, "batch_size": s.train_batch, "channels_last": True}
    train.update(resnet50_train(device, dtype, s, compile_=False))
    if args.skip_compile:
        train["compile"] = "skipped"
    else:
        train["compile"] = resnet50_compiled(device, dtype, s)
        if isinstance(train["compile"], dict):
            train["compile_speedup"] = train["compile"]["img_per_s"] / train["img_per_s"]
    vit = {**image, "batch_size": s.infer_batch, **vit_b16_inference(device, dtype, s)}
    fct = {**common, "batch_size": s.fct_batch, **fct_transform(device, dtype, s)}
    result = {
        "machine": machine_info(),
        "args": vars(args),
        "sizes": asdict(s),
        **common,
        "measurements": {"resnet50_train": train, "vit_b16_inference": vit, "fct_transform": fct},
    }
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
