"""Start-up of the ``raycompat`` CLI against the plain Python a user would run instead.

    .venv/bin/python benchmarks/cli_startup.py --out benchmarks/results/cli_startup_cpu.json

Each command runs as a fresh process, timed from start to exit with its peak RSS (``wait4``);
ours and its baseline alternate, ``--pairs`` pairs, medians of each and of the ratios:

- ``help``: ``raycompat --help`` against ``python -c "import numpy, pyarrow"``;
- ``versions``: ``raycompat versions bench --store S`` against the same baseline;
- ``search_vectors``: ``raycompat search --vectors q.npy -k 10`` on a published ``sharded_ivf``
  version (``--rows`` x ``--width``, default 200k x 32, or the 1M store of
  ``search_latency.py`` with ``--store``) against a script that reads the same build's index and
  ids with faiss and pyarrow, searches and prints the ids (the fixed cost the CLI adds: store,
  catalog and grant lookups, index verification, labels);
- ``search_ids``: ``raycompat search --ids`` (finds the stored rows by a scan of the version:
  O(N), reported without a baseline).

Also reported: ``python -X importtime -c "import raycompat.cli.app"``: the total and the slowest
imports, and whether torch or Ray appear in it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gallery import GALLERY, centres_of, load, mixture, publish_mixture  # noqa: E402
from _machine import emit, machine_info, store_parser, store_root  # noqa: E402
from search_latency import _build_folder  # noqa: E402

from raycompat.index.version_index import build_version_index, load_version_index  # noqa: E402
from raycompat.store import GalleryStore, StoreError  # noqa: E402
from raycompat.store.model_catalog import Catalog, ModelRecord, QueryGrant  # noqa: E402

CLI = str(Path(sys.executable).with_name("raycompat"))
TIME = "/usr/bin/time"  # GNU time: peak RSS of the command alone
SCRIPT = """
import sys
import faiss, numpy as np, pyarrow.parquet as pq
folder, queries = sys.argv[1], np.load(sys.argv[2])
index = faiss.read_index(folder + "/index.faiss", faiss.IO_FLAG_ONDISK_SAME_DIR)
ids = pq.read_table(folder + "/ids.parquet").column("id").to_numpy()
faiss.normalize_L2(queries)
_, rows = index.search(queries, 10)
print(ids[rows])
"""


def timed(argv: list[str]) -> tuple[float, float]:
    """``(seconds, peak RSS in MB)`` of one run of ``argv`` (its output discarded). The RSS is
    read by GNU time, whose child starts clean: a child of this process would report this
    process's peak (fork + exec keep the larger of the two)."""
    with tempfile.NamedTemporaryFile("r") as rss:
        start = time.perf_counter()
        done = subprocess.run(
            [TIME, "-f", "%M", "-o", rss.name, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{argv} failed: {done.stderr[-2000:]}")
        return seconds, int(rss.read().split()[-1]) / 1024


def paired_runs(ours: list[str], baseline: list[str] | None, pairs: int) -> dict:
    runs = {"ours": [], "baseline": []}
    for k in range(pairs):
        order = [("ours", ours), ("baseline", baseline)]
        for name, argv in order if k % 2 == 0 else order[::-1]:
            if argv is not None:
                runs[name].append(timed(argv))
    out = {"ours_s": float(np.median([s for s, _ in runs["ours"]]))}
    out["ours_peak_rss_mb"] = float(np.median([m for _, m in runs["ours"]]))
    if baseline is not None:
        out["baseline_s"] = float(np.median([s for s, _ in runs["baseline"]]))
        out["baseline_peak_rss_mb"] = float(np.median([m for _, m in runs["baseline"]]))
        ratios = [a[0] / b[0] for a, b in zip(runs["ours"], runs["baseline"], strict=True)]
        out["ratio_median"] = float(np.median(ratios))
        out["ratios"] = [round(r, 3) for r in ratios]
    return out


def prepare(root: str, rows: int, width: int) -> None:
    """The version, its index and a model ``bench`` granted to query it (idempotent)."""
    publish_mixture(root, "v1", rows, width)
    store, catalog = GalleryStore(root), Catalog(GalleryStore(root))
    try:
        load_version_index(store, GALLERY, "v1", use_gpu=False)
    except StoreError:
        build_version_index(store, GALLERY, "v1", kind="sharded_ivf", use_gpu=False)
    try:
        catalog.model("bench")
    except StoreError:
        catalog.register_model(ModelRecord("bench", root, width, method="independent"))
        catalog.grant(QueryGrant(GALLERY, "v1", "bench", "extracted"))


def import_profile() -> dict:
    """``-X importtime`` of ``import raycompat.cli.app``: total, and the modules slowest to load
    themselves (their own time, without what they import)."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import raycompat.cli.app"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    rows = []
    for line in err.splitlines()[1:]:  # "import time: self | cumulative | <indent>name"
        _, self_us, total_us, name = line.replace(":", "|", 1).split("|")
        rows.append((int(self_us), int(total_us), name[1:]))  # nested ones keep their indent
    names = {n.strip() for _, _, n in rows}
    return {
        "total_s": sum(total for _, total, n in rows if not n.startswith(" ")) / 1e6,
        "slowest_self": [{"module": n.strip(), "s": us / 1e6} for us, _, n in sorted(rows)[-8:]],
        "torch_imported": "torch" in names,
        "ray_imported": "ray" in names,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = store_parser(__doc__, rows=200_000, width=32)
    args = parser.parse_args(argv)
    root, temporary = store_root(args.store)
    prepare(root, args.rows, args.width)
    queries = Path(root, "q.npy")
    np.save(queries, mixture(np.random.default_rng(2), centres_of(args.width), 1))
    where = ["--store", root, "--gallery", GALLERY, "--model", "bench", "-k", "10"]
    plain = [sys.executable, "-c", "import numpy, pyarrow"]
    script = [sys.executable, "-c", SCRIPT, str(_build_folder(root)), str(queries)]
    result = {"benchmark": "cli_startup", "machine": machine_info(), "args": vars(args)}
    result["load_start"] = load()
    result["help"] = paired_runs([CLI, "--help"], plain, args.pairs)
    result["versions"] = paired_runs([CLI, "versions", GALLERY, "--store", root], plain, args.pairs)
    search = [CLI, "search", "--vectors", str(queries), *where]
    result["search_vectors"] = paired_runs(search, script, args.pairs)
    ids = [CLI, "search", "--ids", "17", *where]
    result["search_ids"] = paired_runs(ids, None, max(3, args.pairs // 2))
    result["import_raycompat_cli"] = import_profile()
    result["load_end"] = load()
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
