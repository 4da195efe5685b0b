"""Where the sharded IVF's coarse quantizer should switch from flat to HNSW: assignment time per
added row and recall@10, flat against faiss ``IndexHNSWFlat(d, 32)`` over the same centroids.

    .venv/bin/python benchmarks/ivf_quantizer.py --out benchmarks/results/ivf_quantizer_cpu.json

Unit rows around 1000 random centres (as ``index_scale.py``), on one faiss thread (an add task's
share). For each ``nlist``: centroids drawn from the data (k-means would place them alike; its
cost is not what is measured), then ``--assign-rows`` rows assigned to their nearest centroid by
the flat quantizer and by the HNSW at each ``efSearch`` (best of 2 runs, alternated), and the
share of rows the HNSW sends to the flat quantizer's list. Then, for ``--recall-nlist`` on
``--recall-rows`` rows: recall@10 against exact search of an IVF-Flat with either quantizer at
the default ``nprobe``, the HNSW searched with efSearch 16, ``nprobe`` and ``2 nprobe``.
``raycompat.index.search.HNSW_MIN_NLIST`` is the smallest ``nlist`` where HNSW at efSearch 16
assigns faster than flat, with recall@10 within 0.005 of flat's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.index.search import HNSW_M, ivf_nprobe  # noqa: E402

IP = faiss.METRIC_INNER_PRODUCT


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def mixture(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    picked = centres[rng.integers(0, len(centres), n)]
    return unit(picked + rng.normal(size=picked.shape) / np.sqrt(centres.shape[1]))


def best_of(runs: int, fn) -> tuple[float, np.ndarray]:
    out, best = None, float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def assignment(rng, centres, nlist: int, x: np.ndarray, efs: list[int]) -> dict:
    """Seconds per row to assign ``x`` with a flat quantizer and an HNSW at each efSearch."""
    cents = mixture(rng, centres, nlist)
    flat = faiss.IndexFlat(x.shape[1], IP)
    flat.add(cents)
    graph = faiss.IndexHNSWFlat(x.shape[1], HNSW_M, IP)
    start = time.perf_counter()
    graph.add(cents)
    row = {"nlist": nlist, "hnsw_build_s": time.perf_counter() - start}
    seconds, ref = best_of(2, lambda: flat.search(x, 1)[1])
    row["flat_us_per_row"] = 1e6 * seconds / len(x)
    for ef in efs:
        graph.hnsw.efSearch = ef
        seconds, got = best_of(2, lambda: graph.search(x, 1)[1])
        row[f"hnsw_ef{ef}_us_per_row"] = 1e6 * seconds / len(x)
        row[f"hnsw_ef{ef}_same_list"] = float((got[:, 0] == ref[:, 0]).mean())
    row["hnsw_ef16_over_flat"] = row["hnsw_ef16_us_per_row"] / row["flat_us_per_row"]
    return row


def recall(rng, centres, nlist: int, x: np.ndarray, queries: np.ndarray) -> dict:
    """recall@10 of an IVF-Flat with each quantizer, and its add time per row."""
    exact = faiss.IndexFlat(x.shape[1], IP)
    exact.add(x)
    truth = exact.search(queries, 10)[1]
    nprobe, d = ivf_nprobe(nlist), x.shape[1]
    cents = x[rng.choice(len(x), nlist, replace=False)]

    def score(ids):
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth, strict=True)]))

    row = {"nlist": nlist, "rows": len(x), "nprobe": nprobe}
    for name, coarse in (
        ("flat", faiss.IndexFlat(d, IP)),
        ("hnsw", faiss.IndexHNSWFlat(d, 32, IP)),
    ):
        coarse.add(cents)
        ivf = faiss.IndexIVFFlat(coarse, d, nlist, IP)
        seconds, _ = best_of(1, lambda ivf=ivf: ivf.add(x))
        row[f"{name}_add_us_per_row"] = 1e6 * seconds / len(x)
        for ef in (16, nprobe, 2 * nprobe) if name == "hnsw" else (None,):
            params = faiss.SearchParametersIVF(nprobe=nprobe)
            if ef is not None:
                graph = faiss.SearchParametersHNSW(efSearch=ef)
                params.quantizer_params = graph
            key = f"{name}_recall_at_10" + ("" if ef is None else f"_ef{ef}")
            row[key] = score(ivf.search(queries, 10, params=params)[1])
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--nlist", type=int, nargs="+", default=[2**k for k in range(10, 17)])
    parser.add_argument("--ef", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--assign-rows", type=int, default=40_000)
    parser.add_argument("--recall-nlist", type=int, nargs="*", default=[4096, 16384])
    parser.add_argument("--recall-rows", type=int, default=400_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    centres = unit(rng.normal(size=(1000, args.width)))
    x = mixture(rng, centres, args.assign_rows)
    rows = [assignment(rng, centres, n, x, args.ef) for n in args.nlist]
    data, queries = mixture(rng, centres, args.recall_rows), mixture(rng, centres, 300)
    recalls = [recall(rng, centres, n, data, queries) for n in args.recall_nlist]
    faster = [r["nlist"] for r in rows if r["hnsw_ef16_over_flat"] < 1]
    result = {
        "benchmark": "ivf_quantizer",
        "machine": machine_info(),
        "width": args.width,
        "threads": args.threads,
        "assignment": rows,
        "recall": recalls,
        "hnsw_ef16_faster_from_nlist": min(faster) if faster else None,
    }
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
