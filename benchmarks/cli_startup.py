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
  O(N), reported without a baseline);
- ``version``: ``raycompat --version``; ``job_help``: ``raycompat-upgrade --help``;
- ``print_config``: ``python jobs/upgrade.py --print-config`` (the embedded demo history loaded,
  validated and printed); ``print_config_file``: ``raycompat-upgrade --config
  configs/upgrade_mnist.yaml --print-config``; ``config_typo``: ``python jobs/upgrade.py
  upgrades.0.epohcs=1`` (a misspelt key: the one-line error, exit 2); ``method_typo``:
  ``python jobs/upgrade.py upgrades.0.method=bctx`` (a misspelt method name, found by the
  config checks without loading torch: exit 2), all against the same baseline.

Also reported: ``python -X importtime`` of ``import raycompat.cli.app`` and of
``jobs/upgrade.py --print-config``: the total and the slowest imports, and whether torch or Ray
appear in them. ``--cases help,print_config,...`` runs only those (the store is prepared only
for ``versions`` and the searches).
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
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("raycompat"))
UPGRADE = str(Path(sys.executable).with_name("raycompat-upgrade"))  # pip install -e .
UPGRADE_PY = str(ROOT / "jobs" / "upgrade.py")
STORE_CASES = ("versions", "search_vectors", "search_ids")
JOB_CASES = (
    "version", "job_help", "print_config", "print_config_file", "config_typo", "method_typo"
)
CASES = ("help", *STORE_CASES, *JOB_CASES)
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


def timed(argv: list[str], code: int = 0) -> tuple[float, float]:
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
        if done.returncode != code:
            raise RuntimeError(f"{argv} failed: {done.stderr[-2000:]}")
        return seconds, int(rss.read().split()[-1]) / 1024


def paired_runs(ours: list[str], baseline: list[str] | None, pairs: int, code: int = 0) -> dict:
    """Medians of ``pairs`` alternating runs; ``code``: the exit status ``ours`` should give."""
    runs = {"ours": [], "baseline": []}
    for k in range(pairs):
        order = [("ours", ours, code), ("baseline", baseline, 0)]
        for name, argv, expected in order if k % 2 == 0 else order[::-1]:
            if argv is not None:
                runs[name].append(timed(argv, expected))
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


def import_profile(argv: list[str]) -> dict:
    """``-X importtime`` of ``python argv``: total, and the modules slowest to load themselves
    (their own time, without what they import)."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stderr
    err = "\n".join(line for line in err.splitlines() if line.startswith("import time:"))
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


def job_cases(plain: list[str], pairs: int) -> dict:
    """The upgrade job's start-up: its script's ``--help``, and its config validated."""
    demo = ["--config", str(ROOT / "configs" / "upgrade_mnist.yaml"), "--print-config"]
    typo = [sys.executable, UPGRADE_PY, "upgrades.0.epohcs=1"]
    return {
        "version": paired_runs([CLI, "--version"], plain, pairs),
        "job_help": paired_runs([UPGRADE, "--help"], plain, pairs),
        "print_config": paired_runs([sys.executable, UPGRADE_PY, "--print-config"], plain, pairs),
        "print_config_file": paired_runs([UPGRADE, *demo], plain, pairs),
        "config_typo": paired_runs(typo, plain, pairs, code=2),
        "method_typo": paired_runs(
            [sys.executable, UPGRADE_PY, "upgrades.0.method=bctx"], plain, pairs, code=2
        ),
    }


def store_cases(args, plain: list[str]) -> dict:
    """``versions`` and the searches, on the published version (prepared first)."""
    root, temporary = store_root(args.store)
    prepare(root, args.rows, args.width)
    queries = Path(root, "q.npy")
    np.save(queries, mixture(np.random.default_rng(2), centres_of(args.width), 1))
    where = ["--store", root, "--model", "bench", "-k", "10"]
    script = [sys.executable, "-c", SCRIPT, str(_build_folder(root)), str(queries)]
    search = [CLI, "search", GALLERY, "--vectors", str(queries), *where]
    ids = [CLI, "search", GALLERY, "--ids", "17", *where]
    return {
        "versions": paired_runs([CLI, "versions", GALLERY, "--store", root], plain, args.pairs),
        "search_vectors": paired_runs(search, script, args.pairs),
        "search_ids": paired_runs(ids, None, max(3, args.pairs // 2)),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = store_parser(__doc__, rows=200_000, width=32)
    parser.add_argument("--cases", default=",".join(CASES), help=f"some of {', '.join(CASES)}")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; valid: {', '.join(CASES)}")
    plain = [sys.executable, "-c", "import numpy, pyarrow"]
    result = {"benchmark": "cli_startup", "machine": machine_info(), "args": vars(args)}
    result["load_start"] = load()
    measured = {"help": paired_runs([CLI, "--help"], plain, args.pairs)} if "help" in cases else {}
    if set(cases) & set(STORE_CASES):
        measured |= store_cases(args, plain)
    if set(cases) & set(JOB_CASES):
        measured |= job_cases(plain, args.pairs)
    result |= {name: measured[name] for name in CASES if name in cases}
    result["import_raycompat_cli"] = import_profile(["-c", "import raycompat.cli.app"])
    result["import_print_config"] = import_profile([UPGRADE_PY, "--print-config"])
    result["load_end"] = load()
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
