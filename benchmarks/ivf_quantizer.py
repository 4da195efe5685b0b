"""Where the sharded IVF's coarse quantizer should switch from flat to HNSW, and how the graph
should add: assignment time per added row and recall@10, flat against faiss
``IndexHNSWFlat(d, M)`` over the same centroids.

    .venv/bin/python benchmarks/ivf_quantizer.py --m 16 32 --ef 8 12 16 32 --add-ef 8 12 16 \
        --nlist 4096 8192 16384 65536 --out benchmarks/results/ivf_quantizer_cpu.json

Unit rows around 1000 random centres (as ``index_scale.py``), or with ``--data uniform`` rows
uniform on the sphere (no cluster structure: the hardest case), on one faiss thread (an add
task's share). For each ``nlist``: centroids drawn from the data (k-means would place them
alike; its cost is not what is measured), then ``--assign-rows`` rows assigned to their nearest
centroid by the flat quantizer and by an HNSW of each degree ``--m`` at each efSearch ``--ef``
(best of 2 runs), and the share of rows the HNSW sends to the flat quantizer's list. Then, for
``--recall-nlist`` on ``--recall-rows`` rows: the add time per row and recall@10 against exact
search of an IVF-Flat with the flat quantizer and with each HNSW adding at each ``--add-ef``,
searched at the default ``nprobe`` with the graph's efSearch 16, ``nprobe`` and ``2 nprobe``.
``raycompat.index.ivf.HNSW_MIN_NLIST``, ``HNSW_M`` and ``HNSW_EF_ADD`` were chosen from these
(benchmarks/README.md).
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

from raycompat.index.ivf import HNSW_EF_ADD, HNSW_M, ivf_nprobe  # noqa: E402

IP = faiss.METRIC_INNER_PRODUCT


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def mixture(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    """Rows around ``centres``; with no centres, uniform on the sphere (the hardest case: no
    cluster structure, every row nearly as close to many centroids)."""
    if not len(centres):
        return unit(rng.normal(size=(n, centres.shape[1])))
    picked = centres[rng.integers(0, len(centres), n)]
    return unit(picked + rng.normal(size=picked.shape) / np.sqrt(centres.shape[1]))


def best_of(runs: int, fn) -> tuple[float, np.ndarray]:
    out, best = None, float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def assignment(rng, centres, nlist: int, x: np.ndarray, efs: list[int], ms: list[int]) -> dict:
    """Seconds per row to assign ``x`` with a flat quantizer and an HNSW of each degree ``M``
    at each efSearch (keys ``hnsw<M>_ef<ef>_*``)."""
    cents = mixture(rng, centres, nlist)
    flat = faiss.IndexFlat(x.shape[1], IP)
    flat.add(cents)
    row = {"nlist": nlist}
    seconds, ref = best_of(2, lambda: flat.search(x, 1)[1])
    row["flat_us_per_row"] = 1e6 * seconds / len(x)
    for m in ms:
        graph = faiss.IndexHNSWFlat(x.shape[1], m, IP)
        start = time.perf_counter()
        graph.add(cents)
        row[f"hnsw{m}_build_s"] = time.perf_counter() - start
        for ef in efs:
            graph.hnsw.efSearch = ef
            seconds, got = best_of(2, lambda graph=graph: graph.search(x, 1)[1])
            row[f"hnsw{m}_ef{ef}_us_per_row"] = 1e6 * seconds / len(x)
            row[f"hnsw{m}_ef{ef}_over_flat"] = 1e6 * seconds / len(x) / row["flat_us_per_row"]
            row[f"hnsw{m}_ef{ef}_same_list"] = float((got[:, 0] == ref[:, 0]).mean())
    return row


def recall(nlist: int, x: np.ndarray, queries: np.ndarray, graphs: list[tuple], rng) -> dict:
    """recall@10 of an IVF-Flat with a flat quantizer and with an HNSW of each ``(M, efSearch
    when adding)`` in ``graphs``, searched with efSearch 16, ``nprobe`` and ``2 nprobe``; the add
    time per row of each."""
    exact = faiss.IndexFlat(x.shape[1], IP)
    exact.add(x)
    truth = exact.search(queries, 10)[1]
    nprobe, d = ivf_nprobe(nlist), x.shape[1]
    cents = x[rng.choice(len(x), nlist, replace=False)]

    def score(ids):
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth, strict=True)]))

    row = {"nlist": nlist, "rows": len(x), "nprobe": nprobe}
    for m, add_ef in [(None, None), *graphs]:
        name = "flat" if m is None else f"hnsw{m}_add_ef{add_ef}"
        coarse = faiss.IndexFlat(d, IP) if m is None else faiss.IndexHNSWFlat(d, m, IP)
        coarse.add(cents)
        if m is not None:
            coarse.hnsw.efSearch = add_ef
        ivf = faiss.IndexIVFFlat(coarse, d, nlist, IP)
        seconds, _ = best_of(1, lambda ivf=ivf: ivf.add(x))
        row[f"{name}_add_us_per_row"] = 1e6 * seconds / len(x)
        for ef in (None,) if m is None else (16, nprobe, 2 * nprobe):
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
    parser.add_argument("--ef", type=int, nargs="+", default=[HNSW_EF_ADD, 16, 32, 64])
    parser.add_argument("--m", type=int, nargs="+", default=[HNSW_M], help="HNSW degrees M")
    parser.add_argument(
        "--add-ef",
        type=int,
        nargs="+",
        default=[HNSW_EF_ADD],
        help="efSearch when adding, for the recall runs (each with each --m)",
    )
    parser.add_argument(
        "--data",
        choices=("mixture", "uniform"),
        default="mixture",
        help="rows around 1000 centres, or uniform on the sphere (no cluster structure)",
    )
    parser.add_argument("--assign-rows", type=int, default=40_000)
    parser.add_argument("--recall-nlist", type=int, nargs="*", default=[4096, 16384])
    parser.add_argument("--recall-rows", type=int, default=400_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    centres = unit(rng.normal(size=(1000 if args.data == "mixture" else 0, args.width)))
    x = mixture(rng, centres, args.assign_rows)
    efs = sorted(set(args.ef))
    rows = [assignment(rng, centres, n, x, efs, args.m) for n in args.nlist]
    data, queries = mixture(rng, centres, args.recall_rows), mixture(rng, centres, 300)
    graphs = [(m, ef) for m in args.m for ef in args.add_ef]
    recalls = [recall(n, data, queries, graphs, rng) for n in args.recall_nlist]
    key = f"hnsw{HNSW_M}_ef{HNSW_EF_ADD}_over_flat"  # the library's graph, as it adds
    faster = [r["nlist"] for r in rows if r.get(key, 1) < 1]
    result = {
        "benchmark": "ivf_quantizer",
        "machine": machine_info(),
        "width": args.width,
        "threads": args.threads,
        "data": args.data,
        "library": {"hnsw_m": HNSW_M, "hnsw_ef_add": HNSW_EF_ADD},
        "assignment": rows,
        "recall": recalls,
        "library_graph_faster_from_nlist": min(faster) if faster else None,
    }
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
