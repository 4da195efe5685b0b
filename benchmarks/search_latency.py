"""Search latency of a published ``sharded_ivf`` version against faiss reading the same files.

    .venv/bin/python benchmarks/search_latency.py --rows 1000000 \
        --out benchmarks/results/search_latency_cpu.json

A cosine version of ``--rows`` x ``--width`` unit rows (int64 ids) is published in a local store
(``--store DIR`` keeps it for a rerun) and indexed with ``kind="sharded_ivf"`` in this process
(no Ray: ``LocalTasks``; 1M rows -> 4,096 lists, nprobe 64). Then, in this one process:

- ours: ``load_version_index`` and ``VersionIndex.hits(queries, k)``: query checks and
  normalisation, faiss search over the memory-mapped lists, padding dropped, rows mapped to ids
  (what ``raycompat search`` calls);
- faiss: the script a user would write over the same build folder: ``faiss.read_index(
  index.faiss, IO_FLAG_ONDISK_SAME_DIR)``, the ids of ``ids.parquet`` in a NumPy array,
  ``faiss.normalize_L2`` then ``index.search`` then ``ids[rows]``; once as read
  (``prefetch_nthread`` 32, faiss's default) and once with ``prefetch_nthread = 0`` (faiss at
  its best here; the target's baseline).

Single query: each pair times ``--singles`` queries one call at a time with ours, then with the
baseline (the order alternates), per call; batch: one call of ``--batch`` queries each. Medians
of ``--pairs`` pairs and of their ratios. Both answer the same ids (checked).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gallery import (  # noqa: E402
    GALLERY,
    FaissScript,
    centres_of,
    load,
    mixture,
    one_at_a_time,
    paired,
    per_query,
    publish_mixture,
)
from _machine import emit, machine_info, store_parser, store_root  # noqa: E402

from raycompat.index.version_index import build_version_index, load_version_index  # noqa: E402
from raycompat.store import GalleryStore  # noqa: E402

K = 10


def build(root: str, rows: int, width: int) -> dict:
    start = time.perf_counter()
    publish_mixture(root, "v1", rows, width)
    published = time.perf_counter() - start
    store = GalleryStore(root)
    try:
        load_version_index(store, GALLERY, "v1", use_gpu=False)
        built = 0.0
    except Exception:  # noqa: BLE001 - no index yet (a fresh store): build it
        start = time.perf_counter()
        build_version_index(store, GALLERY, "v1", kind="sharded_ivf", use_gpu=False)
        built = time.perf_counter() - start
    return {"publish_s": published, "index_build_s": built}


def compare(ours, script: FaissScript, queries: np.ndarray, args) -> dict:
    singles, batch = queries[: args.singles], queries
    assert all(
        np.array_equal(ids, script.search(q[None])[0])
        for q, (_, ids) in zip(singles, [ours.hits(q[None], K)[0] for q in singles], strict=True)
    ), "ours and faiss answer different ids"
    single = paired(
        one_at_a_time(lambda q: ours.hits(q, K), singles),
        one_at_a_time(script.search, singles),
        args.pairs,
    )
    many = paired(lambda: ours.hits(batch, K), lambda: script.search(batch), args.pairs)
    return {"single_query": per_query(single, len(singles)), "batch": per_query(many, len(batch))}


def main(argv: list[str] | None = None) -> dict:
    parser = store_parser(__doc__, rows=1_000_000, width=32)
    parser.add_argument("--singles", type=int, default=200, help="single queries per pair")
    parser.add_argument("--batch", type=int, default=1000, help="queries of the batch call")
    args = parser.parse_args(argv)
    root, temporary = store_root(args.store)
    result = {"benchmark": "search_latency", "machine": machine_info(), "args": vars(args)}
    result["prepare"] = build(root, args.rows, args.width)
    result["load_start"] = load()
    ours = load_version_index(GalleryStore(root), GALLERY, "v1", use_gpu=False)
    folder = _build_folder(root)
    nprobe = int(ours.index.index.nprobe)
    result.update(nlist=int(ours.index.index.nlist), nprobe=nprobe, k=K)
    queries = mixture(np.random.default_rng(2), centres_of(args.width), args.batch)
    prefetch_0 = FaissScript(folder, K, nprobe=nprobe, prefetch=0)
    result["faiss_prefetch_0"] = compare(ours, prefetch_0, queries, args)
    result["faiss_as_read"] = compare(ours, FaissScript(folder, K, nprobe=nprobe), queries, args)
    result["faiss_threads"] = faiss.omp_get_max_threads()
    result["load_end"] = load()
    emit(result, args.out)
    return result


def _build_folder(root: str) -> Path:
    """The current build's folder, from the version's index pointer."""
    pointer = json.loads(Path(root, GALLERY, "_index", "v1.json").read_text())
    return Path(root, GALLERY, "_index", "v1", pointer["build"])


if __name__ == "__main__":
    main()
