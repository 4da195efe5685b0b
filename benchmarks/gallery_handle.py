"""Searches through a gallery handle (``open_gallery``) against faiss reading the same files.

    .venv/bin/python benchmarks/gallery_handle.py --rows 1000000 --store /tmp/gallery_1m \
        --out benchmarks/results/gallery_handle.json

A cosine version of ``--rows`` x ``--width`` unit rows (int64 ids, unlabelled) is published in
a local store (``--store DIR`` keeps it for a rerun), its model registered and granted it, and
indexed as ``kind="auto"`` makes it (``flat`` up to 100,000 rows, ``sharded_ivf`` above: 1M
rows -> 4,096 lists, nprobe 64), in this process. Then, in this one process:

- ours: ``open_gallery(store, gallery, model=...)`` once, then ``Gallery.search(vectors=q,
  k=10)``: the query checks and normalisation, faiss, padding dropped, rows mapped to ids,
  labels looked up, a ``SearchResult`` (the one-shot ``raycompat.serving.search`` opens and
  verifies the index on every call instead: ``--one-shot`` times it too);
- faiss: the script a user would write over the same build folder: ``faiss.read_index``
  (``IO_FLAG_ONDISK_SAME_DIR`` for on-disk lists), the ids of ``ids.parquet`` read with plain
  pyarrow into a NumPy array, ``faiss.normalize_L2``, ``index.search``, ``ids[rows]``; for
  on-disk lists once as read (faiss's 32 read-ahead threads) and once with
  ``prefetch_nthread = 0`` (faiss at its best here, as the loader sets it: the target's
  baseline).

Single query: each round times ``--singles`` queries one call at a time with ours, then with the
baseline (who goes first alternates); batch: one call of ``--batch`` queries each. Medians of
``--pairs`` rounds and of their per-round ratios, in wall time (``wall``) and in this process's
CPU time (``cpu``, every thread's: steadier where other work loads the machine). Both answer
the same ids (checked). Targets: a single query at most 1.2x faiss's, a batch of 1,000 at most
1.05x.
"""

from __future__ import annotations

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

from raycompat import open_gallery  # noqa: E402
from raycompat.index.version_index import build_version_index, published_pointer  # noqa: E402
from raycompat.serving import search  # noqa: E402
from raycompat.store import GalleryStore  # noqa: E402
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant  # noqa: E402

K = 10
MODEL = "bench"  # publish_mixture's model
TARGETS = {"single_query": 1.2, "batch": 1.05}


def prepare(root: str, rows: int, width: int) -> tuple[dict, dict]:
    """The version published, granted and indexed (each unless an earlier run did it); the
    seconds each took and the published pointer."""
    start = time.perf_counter()
    publish_mixture(root, "v1", rows, width)
    published = time.perf_counter() - start
    store = GalleryStore(root)
    catalog = Catalog(store)
    if catalog.grant_of(GALLERY, MODEL) is None:
        catalog.register_model(ModelRecord(MODEL, "", width, method="independent"))
        catalog.grant(QueryGrant(GALLERY, "v1", MODEL, "extracted"))
    built = 0.0
    if published_pointer(store, GALLERY, "v1") is None:
        start = time.perf_counter()
        build_version_index(store, GALLERY, "v1", use_gpu=False)
        built = time.perf_counter() - start
    pointer = published_pointer(store, GALLERY, "v1")
    return {"publish_s": published, "index_build_s": built}, pointer


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def compare(gallery, script: FaissScript, queries: np.ndarray, args) -> dict:
    singles, batch = queries[: args.singles], queries

    def ours(q: np.ndarray):
        return gallery.search(vectors=q, k=K)

    answered = [h.ids for h in ours(batch).hits]
    assert all(
        np.array_equal(found, expected)
        for found, expected in zip(answered, script.search(batch), strict=True)
    ), "the handle and faiss answer different ids"
    out = {}
    for name, clock in CLOCKS.items():
        one, base = one_at_a_time(ours, singles), one_at_a_time(script.search, singles)
        single = paired(one, base, args.pairs, clock)
        many = paired(lambda: ours(batch), lambda: script.search(batch), args.pairs, clock)
        timed = {
            "single_query": per_query(single, len(singles)),
            "batch": per_query(many, len(batch)),
        }
        timed["met"] = {part: timed[part]["ratio"] <= target for part, target in TARGETS.items()}
        out[name] = timed
    return out


def one_shot(store: GalleryStore, gallery, queries: np.ndarray, pairs: int) -> dict:
    """``raycompat.serving.search`` (opens and verifies the index each call) against the handle,
    one query per call."""
    q = queries[:1]
    timed = paired(
        lambda: search(store, GALLERY, MODEL, vectors=q, k=K),
        lambda: gallery.search(vectors=q, k=K),
        pairs,
    )
    return {
        "search_ms": 1e3 * timed["ours_s"],
        "handle_ms": 1e3 * timed["baseline_s"],
        "ratio": timed["ratio_median"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = store_parser(__doc__, rows=20_000, width=32)
    parser.add_argument("--singles", type=int, default=200, help="single queries per round")
    parser.add_argument("--batch", type=int, default=1000, help="queries of the batch call")
    parser.add_argument("--one-shot", action="store_true", help="time search() once a call")
    args = parser.parse_args(argv)
    root, temporary = store_root(args.store)
    result = {"benchmark": "gallery_handle", "machine": machine_info(), "args": vars(args)}
    result["prepare"], pointer = prepare(root, args.rows, args.width)
    result["load_start"] = load()
    store = GalleryStore(root)
    folder = Path(root, GALLERY, "_index", "v1", pointer["build"])
    on_disk = (folder / "index.ivfdata").exists()
    queries = mixture(np.random.default_rng(2), centres_of(args.width), args.batch)
    with open_gallery(store, GALLERY, model=MODEL, poll_s=None) as gallery:
        index = gallery.loaded().index.index.index
        result["index"] = {
            "kind": pointer["kind"],
            "served": gallery.describe()["index"],
            "nlist": int(getattr(index, "nlist", 0)) or None,
            "nprobe": int(getattr(index, "nprobe", 0)) or None,
            "k": K,
        }
        best = FaissScript(folder, K, on_disk=on_disk, prefetch=0 if on_disk else None)
        result["faiss_best"] = compare(gallery, best, queries, args)
        if on_disk:
            result["faiss_as_read"] = compare(gallery, FaissScript(folder, K), queries, args)
        if args.one_shot:
            result["one_shot"] = one_shot(store, gallery, queries, args.pairs)
    result["targets"] = TARGETS
    result["faiss_threads"] = faiss.omp_get_max_threads()
    result["load_end"] = load()
    emit(result, args.out)
    del temporary
    return result


if __name__ == "__main__":
    main()
