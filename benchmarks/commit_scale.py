"""Commit cost as a version grows: wall time and driver peak RSS of ``Staging.commit``.

    .venv/bin/python benchmarks/commit_scale.py --rows 1000000 4000000 16000000 \
        --out benchmarks/results/commit_scale_cpu.json

For each N, a staging area of ``--parts`` part files (N / parts rows each, ``--width``-d float32
embeddings, int64 ids; narrow rows expose the per-row cost) is written once with the pipelines'
``PartWriter``, as the transform writes it (its records carry input fingerprints). Then each
commit mode runs in a fresh Python process, so that its peak RSS is the commit's own (plus the
imports, measured separately as ``import_rss_mb``). ``begin_seconds`` is the ``begin`` before it,
which adopts the staged parts onto the committing writer's list by reading their records
(O(parts); the commit itself then publishes exactly that list):

- ``rows``: reads every row back on the driver (schema, values, global id uniqueness, and each
  part's id fingerprint against its part record). O(rows) time and memory.
- ``records``: reads only the part records and the listing (byte sizes); rows and fingerprints
  are added up and checked against the input chunks' (the transform's path). O(parts).

The number of parts is fixed, so a commit whose cost depends on parts, not rows, is flat in N.
Reported: seconds, peak RSS, and each as a ratio of the largest N to the smallest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.cluster.pipelines.parts import PartWriter  # noqa: E402
from raycompat.store import (  # noqa: E402
    GalleryStore,
    VersionInfo,
    embedding_schema,
    embedding_table,
)
from raycompat.store.commit.part_record import IdFingerprint  # noqa: E402

# Peak RSS from VmHWM: ru_maxrss would carry the parent's peak across fork + exec.
COMMIT = """
import json, sys, time
from raycompat.store import GalleryStore, VersionInfo
from raycompat.store.commit.part_record import IdFingerprint
root, width, rows, mode, fingerprint = sys.argv[1:6]
store = GalleryStore(root)
info = VersionInfo("v1", "bench", int(width), False, "v1 = bench")
def hwm_mb():
    with open("/proc/self/status") as handle:
        line = next(x for x in handle if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024
before = hwm_mb()
start = time.perf_counter()
staging = store.begin("bench", info, "run")  # adopts the parts by their records: O(parts)
begin_seconds = time.perf_counter() - start
start = time.perf_counter()
if mode == "rows":
    staging.commit(expected_rows=int(rows))
else:
    staging.commit(
        expected_rows=int(rows),
        check="records",
        expected_ids=IdFingerprint.from_dict(json.loads(fingerprint)),
    )
seconds = time.perf_counter() - start
peak = hwm_mb()
print(json.dumps({"seconds": seconds, "begin_seconds": begin_seconds, "peak_rss_mb": peak,
                  "import_rss_mb": before}))
"""


def build(root: str, rows: int, parts: int, width: int) -> dict:
    """Write the staging area (not committed); return the fingerprint of all its ids."""
    store = GalleryStore(root)
    info = VersionInfo("v1", "bench", width, False, "v1 = bench")
    staging = store.begin("bench", info, "run")
    rng = np.random.default_rng(0)
    fingerprint = IdFingerprint()
    for k, part_ids in enumerate(np.array_split(np.arange(rows, dtype=np.int64), parts)):
        # as the transform writes a part: input ids read, rows written 1:1, batch by batch
        writer = PartWriter(staging, f"part-{k:05d}.parquet", embedding_schema(width, "int64"))
        for ids in np.array_split(part_ids, max(1, len(part_ids) // 500_000)):
            table = embedding_table(ids, rng.random((len(ids), width), dtype=np.float32))
            writer.read(table.column("id"))
            writer.write(table)
            fingerprint.update(table.column("id"))
        writer.close()
    staging.release()  # the commit processes take the lease over at once
    return fingerprint.to_dict()


def commit(root: str, rows: int, width: int, mode: str, fingerprint: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", COMMIT, root, str(width), str(rows), mode, json.dumps(fingerprint)],
        check=True,
        capture_output=True,
        text=True,
    )
    record = Path(root, "bench", "_versions", "v1.json")
    record.unlink()  # benchmark only: unpublish, so the next mode commits the same parts
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    parser.add_argument("--parts", type=int, default=16)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--modes", nargs="+", default=["rows", "records"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    runs = []
    for rows in args.rows:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            fingerprint = build(tmp, rows, args.parts, args.width)
            built = time.perf_counter() - start
            for mode in args.modes:
                run = commit(tmp, rows, args.width, mode, fingerprint)
                runs.append({"rows": rows, "parts": args.parts, "mode": mode, **run,
                             "build_seconds": built})
                print(json.dumps(runs[-1]), file=sys.stderr)
    ratios = {}
    for mode in args.modes:
        mine = [r for r in runs if r["mode"] == mode]
        small, large = mine[0], mine[-1]
        ratios[mode] = {
            "rows_ratio": large["rows"] / small["rows"],
            "seconds_ratio": large["seconds"] / small["seconds"],
            "peak_rss_ratio": large["peak_rss_mb"] / small["peak_rss_mb"],
            "rss_above_imports_mb": [r["peak_rss_mb"] - r["import_rss_mb"] for r in mine],
        }
    result = {"benchmark": "commit_scale", "machine": machine_info(), "width": args.width,
              "runs": runs, "largest_over_smallest": ratios}
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
