"""What ``benchmarks/billion.py`` checks of the published v2, one part in memory at a time.

- :func:`verify_v2` (this benchmark's own checks, in its process): v2's record holds N rows
  and v1's id fingerprint; each part's ids strictly increase, fill their range, and the ranges
  tile ``0 .. N-1`` with no gap or overlap (so every id is there once); on a sample of parts the
  map recomputed in NumPy from v1's rows equals v2's rows within float16's rounding.
- :data:`VALIDATE` (a fresh process, the project's read path): ``GalleryStore.iter_batches``
  over v2 (each file's byte size against its record, schema, values, norms, the row count), then
  each file's sha256 against the record's, which no read path of the store checks (reads rely
  on byte sizes and Parquet's page checksums).
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow.parquet as pq
from _billion import GALLERY, Work

TOLERANCE = 1e-3  # two float16 steps below 1.0 (2^-11 each): rounding, not a different map

VALIDATE = """
import hashlib, json, sys, time
root, gallery, version, every = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def hwm_mb():
    with open("/proc/self/status") as handle:
        return int(next(x for x in handle if x.startswith("VmHWM:")).split()[1]) / 1024
from raycompat.store import GalleryStore
store = GalleryStore(root)
start = time.perf_counter()
info = store.version(gallery, version)
rows, last = 0, start
for batch in store.iter_batches(gallery, version, batch_size=262144):
    rows += batch.num_rows
    if time.perf_counter() - last >= every:
        last = time.perf_counter()
        print(f"[billion] validate-on-read: {rows:,} of {info.rows:,} rows", file=sys.stderr,
              flush=True)
read_s, read_rss = time.perf_counter() - start, hwm_mb()
start, changed = time.perf_counter(), []
for entry in info.file_info:
    with open(store.path(gallery, entry["path"]), "rb") as handle:
        if hashlib.file_digest(handle, "sha256").hexdigest() != entry["sha256"]:
            changed.append(entry["path"])
print(json.dumps({"seconds": read_s, "rows": rows, "files": len(info.files),
                  "driver_peak_rss_mb": read_rss, "sha256_seconds": time.perf_counter() - start,
                  "sha256_changed": changed, "sha256_peak_rss_mb": hwm_mb()}))
"""


def id_range(path: str) -> dict:
    """min, max, count, sum of a part's ids and whether they strictly increase."""
    ids = pq.read_table(path, columns=["id"]).column("id").to_numpy()
    return {
        "path": path,
        "min": int(ids[0]),
        "max": int(ids[-1]),
        "count": len(ids),
        "sum": int(ids.sum(dtype=np.int64)),
        "increasing": bool(np.all(ids[1:] > ids[:-1])),
    }


def tiles(ranges: list[dict], rows: int) -> dict:
    """Whether the parts' id ranges cover ``0 .. rows-1`` exactly once."""
    ordered = sorted(ranges, key=lambda r: r["min"])
    dense = all(r["increasing"] and r["max"] - r["min"] + 1 == r["count"] for r in ordered)
    gaps = sum(b["min"] != a["max"] + 1 for a, b in zip(ordered, ordered[1:], strict=False))
    return {
        "count": sum(r["count"] for r in ranges),
        "min": ordered[0]["min"],
        "max": ordered[-1]["max"],
        "sum_ok": sum(r["sum"] for r in ranges) == rows * (rows - 1) // 2,
        "dense_parts": dense,
        "gaps_or_overlaps": gaps,
    }


def rows_of(paths: list[str], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, float32 rows)`` with ids in ``lo .. hi`` from v1's files, found by the id
    statistics of their footers."""
    from raycompat.store.read.vectors import float32_rows

    ids, rows = [], []
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        column = meta.schema.to_arrow_schema().get_field_index("id")
        stats = [meta.row_group(g).column(column).statistics for g in range(meta.num_row_groups)]
        if max(s.max for s in stats) < lo or min(s.min for s in stats) > hi:
            continue
        table = pq.read_table(path)
        found = table.column("id").to_numpy()
        keep = (found >= lo) & (found <= hi)
        ids.append(found[keep])
        rows.append(float32_rows(table.column("embedding").combine_chunks())[keep])
    return np.concatenate(ids), np.concatenate(rows)


def recomputed(v1_paths: list[str], v2_path: str, weight, bias) -> dict:
    """v2's rows of one part against ``normalize(x W + b)`` of v1's rows of the same ids."""
    from raycompat.store.read.vectors import float32_rows

    table = pq.read_table(v2_path)
    ids = table.column("id").to_numpy()
    stored = float32_rows(table.column("embedding").combine_chunks())
    old_ids, old = rows_of(v1_paths, int(ids.min()), int(ids.max()))
    order = np.argsort(old_ids)
    old_ids, old = old_ids[order], old[order]
    if not np.array_equal(old_ids, np.sort(ids)):
        return {"part": v2_path.rsplit("/", 1)[-1], "same_ids": False}
    expected = old[np.searchsorted(old_ids, ids)] @ weight + bias
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    diff = float(np.abs(expected - stored).max())
    same = float(np.mean(expected.astype(np.float16).astype(np.float32) == stored))
    return {
        "part": v2_path.rsplit("/", 1)[-1],
        "same_ids": True,
        "rows": len(ids),
        "max_abs_diff": diff,
        "equal_after_rounding": same,
    }


def verify_v2(work: Work, rows: int, check_parts: int) -> dict:
    from raycompat.store import GalleryStore
    from raycompat.transformations import load_transformation

    start = time.perf_counter()
    store = GalleryStore(str(work.store))
    v1, v2 = store.version(GALLERY, "v1"), store.version(GALLERY, "v2")
    v1_paths = [p for p, _ in store.version_files(GALLERY, v1)]
    v2_paths = [p for p, _ in store.version_files(GALLERY, v2)]
    ids = tiles([id_range(p) for p in v2_paths], rows)
    h = load_transformation(str(work.h), "h")
    weight, bias = h.weight.numpy(), h.bias.numpy()
    rng = np.random.default_rng(0)
    order = [0, len(v2_paths) - 1, *rng.permutation(len(v2_paths)).tolist()]  # the ends first
    picked = sorted(list(dict.fromkeys(order))[: max(1, check_parts)])
    sample = [recomputed(v1_paths, v2_paths[k], weight, bias) for k in picked]
    passed = (
        v2.rows == rows
        and v2.ids == v1.ids
        and ids["count"] == rows
        and (ids["min"], ids["max"]) == (0, rows - 1)
        and ids["sum_ok"]
        and ids["dense_parts"]
        and ids["gaps_or_overlaps"] == 0
        and all(s["same_ids"] and s["max_abs_diff"] <= TOLERANCE for s in sample)
    )
    return {
        "wall_s": time.perf_counter() - start,
        "passed": passed,
        "record_rows": v2.rows,
        "record_ids_equal_v1": v2.ids == v1.ids,
        "ids": ids,
        "tolerance": TOLERANCE,
        "sample": sample,
    }
