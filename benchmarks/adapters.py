"""Training-free transformations (issue 41, item 6): a query-side map's cost and the fit's rate.

    .venv/bin/python benchmarks/adapters.py --out benchmarks/results/adapters_cpu.json
    .venv/bin/python benchmarks/adapters.py --dim 512 --gallery 100000 --pairs 1000000

(a) Query side, ``--dim`` wide: a fitted ``procrustes`` transformation applied to one query
(batch of 1), per call, the median of ``--repeats`` calls timed one by one, four ways:
``torch.addmm`` alone, the torch module call ``h(q)``, NumPy ``q @ W + b`` (what a user would
write), and ``search_path``: what search runs (``raycompat.serving.version_space.adapted``
on the map ``query_adapter`` builds, ``index/query_map.py``: faiss's ``LinearTransform`` for
this kind, shape check included); against the 10 us target. Then the relative
cost the search path's map adds to a search: a plain faiss ``IndexFlatIP`` over ``--gallery``
unit rows (what a user writes), a batch of ``--batch`` queries and a single query, searched
with and without the map first, interleaved over ``--search-rounds`` rounds; the ratio of
medians against the 5% target.

(b) The Procrustes fit over ``--pairs`` float32 pairs of ``--dim`` columns as ``raycompat
adapt`` runs it, ``fit_kind("procrustes", x, y)``: ``PairStatistics.of(x, y, gram=False,
sums=False)`` (pair checks, X^T Y per block in float32 summed in float64, the sums of squares)
then ``fit_procrustes`` (an SVD of the d x d cross-covariance), as a rate ratio to one plain
float32 ``X.T @ Y`` over the same arrays, NumPy's and torch's, against the faster of the two
(the target's baseline: within 1.1x of its time); also the statistics with the column sums
(what a centred fit needs), the full statistics (with X^T X, what ``affine`` needs) and a
float64 ``X.T @ Y``. Rounds interleave the variants (rotating the order); medians of the wall
time and of this process's CPU time (user + sys: on a loaded machine the wall time also counts
the waits for a core, and two threads that wait for each other, while the CPU time counts the
work). ``--threads`` sets torch's threads and NumPy's BLAS threads (threadpoolctl).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.index.query_map import search_map  # noqa: E402
from raycompat.serving.version_space import adapted  # noqa: E402
from raycompat.transformations import PairStatistics, fit_kind, fit_procrustes  # noqa: E402

K = 10
QUERY_TARGET_US = 10.0
SEARCH_TARGET = 0.05
FIT_TARGET = 1 / 1.1  # the fit's rate over the plain product's: within 1.1x of its time
PLAIN_PRODUCTS = ("numpy_xty_float32", "torch_xty_float32")  # the fit's baseline: the faster


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    rows = rng.standard_normal((n, d), dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def pairs(rng: np.random.Generator, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    x = unit_rows(rng, n, d)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    noise = rng.standard_normal((n, d), dtype=np.float32)
    return x, x @ q.astype(np.float32) + np.float32(0.05 / np.sqrt(d)) * noise


def per_call_us(fn, repeats: int) -> float:
    """Median microseconds of ``repeats`` calls, each timed alone."""
    for _ in range(min(repeats, 200)):
        fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def query_side(args: argparse.Namespace, rng: np.random.Generator) -> dict:
    x, y = pairs(rng, 4 * args.dim, args.dim)
    h = fit_procrustes(PairStatistics.of(x, y, gram=False)).transformation
    weight, bias = h.weight.numpy(), h.bias.numpy()
    query = torch.from_numpy(unit_rows(rng, 1, args.dim))
    query_np = query.numpy()
    with torch.inference_mode():
        single = {
            "torch_addmm_us": per_call_us(
                lambda: torch.addmm(h.bias, query, h.weight), args.repeats
            ),
            "torch_module_us": per_call_us(lambda: h(query), args.repeats),
            "numpy_us": per_call_us(lambda: query_np @ weight + bias, args.repeats),
        }
    mapped = search_map(h)  # what query_adapter hands the search
    single["search_path_us"] = per_call_us(lambda: adapted(mapped, query_np), args.repeats)
    single["target_us"] = QUERY_TARGET_US
    single["search_path_meets_target"] = single["search_path_us"] <= QUERY_TARGET_US

    index = faiss.IndexFlatIP(args.dim)
    index.add(unit_rows(rng, args.gallery, args.dim))
    batch = unit_rows(rng, args.batch, args.dim)

    search = {}
    for name, queries in (("batch", batch), ("single", batch[:1])):
        plain, with_map = [], []
        for round_ in range(args.search_rounds):
            order = ((plain, False), (with_map, True))
            for times, use_map in order if round_ % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                index.search(adapted(mapped, queries) if use_map else queries, K)
                times.append(time.perf_counter() - start)
        search[name] = {
            "queries": len(queries),
            "plain_faiss_ms": 1e3 * statistics.median(plain),
            "with_map_ms": 1e3 * statistics.median(with_map),
            "added": statistics.median(with_map) / statistics.median(plain) - 1,
        }
    search["target_added"] = SEARCH_TARGET
    search["batch_meets_target"] = search["batch"]["added"] <= SEARCH_TARGET
    return {"single_query": single, "search": search, "gallery": args.gallery, "k": K}


def fit_rate(args: argparse.Namespace, rng: np.random.Generator) -> dict:
    x, y = pairs(rng, args.pairs, args.dim)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    variants = {
        "numpy_xty_float32": lambda: x.T @ y,
        "torch_xty_float32": lambda: tx.T @ ty,
        "procrustes_fit": lambda: fit_kind("procrustes", x, y),
        "procrustes_with_column_sums": lambda: fit_procrustes(PairStatistics.of(x, y, gram=False)),
        "full_statistics_and_procrustes": lambda: fit_procrustes(PairStatistics.of(x, y)),
        "numpy_xty_float64": lambda: x64.T @ y64,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start, start_cpu = time.perf_counter(), time.process_time()
            variants[name]()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    medians = {name: statistics.median(t) for name, t in times.items()}
    cpu_medians = {name: statistics.median(t) for name, t in cpu.items()}
    baseline_name = min(PLAIN_PRODUCTS, key=medians.__getitem__)
    baseline, baseline_cpu = medians[baseline_name], cpu_medians[baseline_name]
    return {
        "pairs": args.pairs,
        "median_s": medians,
        "median_cpu_s": cpu_medians,
        "baseline": baseline_name,
        "rate_ratio_to_baseline": {n: baseline / s for n, s in medians.items()},
        "cpu_ratio_to_baseline": {n: s / baseline_cpu for n, s in cpu_medians.items()},
        "target_ratio": FIT_TARGET,
        "procrustes_meets_target": baseline / medians["procrustes_fit"] >= FIT_TARGET,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--gallery", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5000)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the fit's variants")
    parser.add_argument(
        "--search-rounds", type=int, default=21, help="interleaved rounds of each search"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch and BLAS threads")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        threadpool_limits(args.threads)
    rng = np.random.default_rng(0)
    result = {
        "benchmark": "adapters",
        "machine": {**machine_info(), "faiss_threads": faiss.omp_get_max_threads()},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "query_side": query_side(args, rng),
        "fit": fit_rate(args, rng),
    }
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
