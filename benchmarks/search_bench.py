"""Benchmark raycompat.index.search_index: exact faiss flat vs a NumPy brute force, and IVF-PQ
recall/QPS.

    .venv/bin/python benchmarks/search_bench.py --out benchmarks/results/search_bench_cpu.json

Part 1: ``--n`` x ``--dim`` gallery (default 100k x 128), ``--queries`` queries, top-10: QPS of
``build_index(kind="flat")`` and of a chunked NumPy matmul + argpartition reference, their ratio,
and recall@10 of flat against the reference (must be 1.0). Part 2: IVF-PQ on ``--ivf-n``
vectors (default 1M): 10-recall@10 and 1-recall@10 against exact flat search, and QPS, for
several nprobe values.

Data are synthetic and seeded: a 32-d Gaussian mixture (1000 clusters) mapped linearly to
``--dim`` dims plus small isotropic noise, L2-normalised (cosine). Embeddings of trained networks
have such low intrinsic dimension; isotropic Gaussian data would be a worst case for IVF-PQ.
Every time is the median of ``--repeats`` runs; the whole query batch is one call.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _machine import emit  # noqa: E402

from raycompat.index.factory import build_index  # noqa: E402


def synthetic_embeddings(n: int, dim: int, seed: int, chunk: int = 100_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(1000, 32))
    projection = rng.normal(size=(32, dim)) / np.sqrt(32)
    out = np.empty((n, dim), dtype=np.float32)
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        latent = centres[rng.integers(0, 1000, m)] + 0.5 * rng.normal(size=(m, 32))
        x = latent @ projection + 0.05 * rng.normal(size=(m, dim))
        out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def numpy_brute_force(
    queries: np.ndarray, gallery: np.ndarray, k: int, chunk: int = 256
) -> np.ndarray:
    """Reference top-k by inner product of normalised rows (cosine), best first."""
    out = np.empty((queries.shape[0], k), dtype=np.int64)
    for s in range(0, queries.shape[0], chunk):
        scores = queries[s : s + chunk] @ gallery.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        out[s : s + chunk] = np.take_along_axis(top, order, axis=1)
    return out


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """k-recall@k: fraction of the exact top-k that the search returned in its top-k."""
    k = truth.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth, strict=True)]))


def nn_recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """1-recall@k (faiss' R@k): fraction of queries whose exact nearest item is in the top-k."""
    return float(np.mean((found == truth[:, :1]).any(axis=1)))


def flat_vs_numpy(args) -> dict:
    gallery = synthetic_embeddings(args.n, args.dim, args.seed)
    queries = synthetic_embeddings(args.queries, args.dim, args.seed + 1)
    index = build_index(gallery, "cosine", "flat", use_gpu=False)
    t_faiss, (_, faiss_idx) = median_time(lambda: index.search(queries, args.k), args.repeats)
    t_numpy, numpy_idx = median_time(
        lambda: numpy_brute_force(queries, gallery, args.k), args.repeats
    )
    return {
        "gallery": [args.n, args.dim],
        "queries": args.queries,
        "k": args.k,
        "distance": "cosine",
        "faiss_flat": {"median_s": t_faiss, "qps": args.queries / t_faiss},
        "numpy_brute_force": {"median_s": t_numpy, "qps": args.queries / t_numpy},
        "speedup_faiss_over_numpy": t_numpy / t_faiss,
        f"recall@{args.k}_flat_vs_numpy": recall_at_k(faiss_idx, numpy_idx),
    }


def ivfpq_sweep(args) -> dict:
    gallery = synthetic_embeddings(args.ivf_n, args.dim, args.seed + 2)
    queries = synthetic_embeddings(args.queries, args.dim, args.seed + 3)
    start = time.perf_counter()
    truth = build_index(gallery, "cosine", "flat", use_gpu=False).search(queries, args.k)[1]
    t_truth = time.perf_counter() - start
    start = time.perf_counter()
    index = build_index(
        gallery,
        "cosine",
        "ivfpq",
        nlist=args.nlist,
        m=args.m,
        nbits=8,
        train_size=min(args.train_size, args.ivf_n),
        use_gpu=False,
        seed=args.seed,
    )
    t_build = time.perf_counter() - start
    sweep = []
    for nprobe in args.nprobe:
        index.set_nprobe(nprobe)
        t, (_, found) = median_time(lambda: index.search(queries, args.k), args.repeats)
        sweep.append(
            {
                "nprobe": nprobe,
                f"recall@{args.k}": recall_at_k(found, truth),
                f"1-recall@{args.k}": nn_recall_at_k(found, truth),
                "median_s": t,
                "qps": args.queries / t,
            }
        )
    return {
        "gallery": [args.ivf_n, args.dim],
        "queries": args.queries,
        "k": args.k,
        "nlist": args.nlist,
        "m": args.m,
        "nbits": 8,
        "train_size": min(args.train_size, args.ivf_n),
        "build_s": t_build,
        "exact_flat_search_s": t_truth,
        "sweep": sweep,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000, help="gallery size for flat vs NumPy")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--ivf-n", type=int, default=1_000_000, help="gallery size for IVF-PQ")
    p.add_argument("--nlist", type=int, default=1024)
    p.add_argument("--m", type=int, default=32, help="PQ sub-quantizers (bytes per vector)")
    p.add_argument("--train-size", type=int, default=100_000)
    p.add_argument("--nprobe", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-ivf", action="store_true")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)

    faiss.omp_set_num_threads(args.threads)
    try:  # keep NumPy's BLAS to the same thread count, when threadpoolctl is installed
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    except ImportError:
        pass
    result = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "threads": args.threads,
            "faiss": faiss.__version__,
            "numpy": np.__version__,
            "faiss_gpus": faiss.get_num_gpus(),
            "loadavg_start": os.getloadavg(),
        },
        "repeats": args.repeats,
        "flat_vs_numpy": flat_vs_numpy(args),
    }
    if not args.skip_ivf:
        result["ivfpq"] = ivfpq_sweep(args)
    result["machine"]["loadavg_end"] = os.getloadavg()
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
