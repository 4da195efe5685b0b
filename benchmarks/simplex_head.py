"""d-Simplex head: closed-form O(B*K) logits vs the dense K x (K-1) matmul.

Each (K, variant) runs in its own subprocess so that its peak RSS is its own. Prints JSON with
the median forward+backward time of each variant, peak memory, and the dense/closed ratios.

    python benchmarks/simplex_head.py [--ks 1000 22000] [--batch 256] [--repeats 5] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def worker(k: int, variant: str, batch: int, repeats: int, device: str) -> dict:
    import torch

    from raycompat.nn.heads import create_head

    torch.manual_seed(0)
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    head = create_head(
        "dsimplex", feature_dim=k - 1, num_classes=k, closed_form=(variant == "closed_form")
    ).to(device)
    features = torch.randn(batch, k - 1, device=device, requires_grad=True)
    targets = torch.randint(0, k, (batch,), device=device)
    times = []
    for _ in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(head(features), targets)
        loss.backward()
        features.grad = None
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    result = {
        "k": k,
        "variant": variant,
        "batch": batch,
        "device": device,
        "median_s": statistics.median(times[1:]),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mib": start_rss / 1024,
    }
    if device == "cuda":
        result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[1000, 22000])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out")
    parser.add_argument("--worker", nargs=2, metavar=("K", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        k, variant = int(args.worker[0]), args.worker[1]
        print(json.dumps(worker(k, variant, args.batch, args.repeats, args.device)))
        return {}

    from _machine import emit, machine_info

    runs = []
    for k in args.ks:
        pair = {}
        for variant in ("closed_form", "dense"):
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                str(k),
                variant,
                "--batch",
                str(args.batch),
                "--repeats",
                str(args.repeats),
                "--device",
                args.device,
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            pair[variant] = json.loads(out.strip().splitlines()[-1])
        runs.append(
            {
                "k": k,
                "closed_form": pair["closed_form"],
                "dense": pair["dense"],
                "time_ratio_dense_over_closed": pair["dense"]["median_s"]
                / pair["closed_form"]["median_s"],
                "peak_rss_ratio_dense_over_closed": pair["dense"]["peak_rss_mib"]
                / pair["closed_form"]["peak_rss_mib"],
            }
        )
    report = {"benchmark": "simplex_head", "machine": machine_info(), "runs": runs}
    emit(report, args.out or None)
    return report


if __name__ == "__main__":
    main()
