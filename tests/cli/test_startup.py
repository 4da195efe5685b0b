"""The ``raycompat`` CLI starts like a tool: ``--help``, ``versions`` and ``search --vectors`` /
``--ids`` load neither torch nor Ray (issue 24, item 2; benchmarks/cli_startup.py times them);
nor does loading and validating a job's config (``--print-config``, issue 23, item 4).

Each check runs the CLI in a fresh interpreter and reads back which heavy modules it loaded; a
top-level ``import torch`` anywhere below ``raycompat.cli.app`` fails them, naming the module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from raycompat.index.version_index import build_version_index
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "pandas")

# Runs each argv with raycompat.cli.app.main in this one interpreter, then prints the heavy modules
# loaded and, for each, the first raycompat module on the stack that imported it.
_RUN_CLI = r"""
import importlib, json, sys, traceback
heavy, runs, preload = json.loads(sys.argv[1])
who = {}


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in heavy and name not in who:
            stack = [f.f_globals.get("__name__", "") for f, _ in traceback.walk_stack(None)]
            who[name] = next((m for m in stack if m.startswith("raycompat")), "?")
        return None


sys.meta_path.insert(0, Watch())
import raycompat.cli.app
for name in preload:
    importlib.import_module(name)

codes = []
for argv in runs:
    try:
        codes.append(raycompat.cli.app.main(argv))
    except SystemExit as stop:  # --help
        codes.append(stop.code)
loaded = {name: who.get(name, "?") for name in heavy if name in sys.modules}
print(json.dumps({"codes": codes, "loaded": loaded}))
"""


def cli_modules(*runs: list[str], heavy: tuple[str, ...] = HEAVY, preload=()) -> dict:
    """Exit codes of ``runs`` and the heavy modules they or ``preload`` (module names, imported
    first) loaded: module -> the raycompat module that imported it."""
    result = subprocess.run(
        [sys.executable, "-c", _RUN_CLI, json.dumps([heavy, list(runs), list(preload)])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def store(tmp_path):
    """A 50 x 8 version queried by a registered model ``m1`` (no index built yet)."""
    store = GalleryStore(str(tmp_path / "store"))
    x = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32)
    staging = store.begin("g", VersionInfo("v1", "m1", 8, False, "v1 = extract(m1)"), "t")
    staging.write_table(embedding_table([f"i{k}" for k in range(50)], x), "p.parquet")
    staging.commit(expected_rows=50)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", str(tmp_path / "m1"), 8, method="independent"))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted"))
    np.save(tmp_path / "q.npy", x[:3])
    return store, tmp_path / "q.npy"


def test_help_and_import_load_no_torch_ray_or_pandas():
    out = cli_modules(["--help"], ["search", "--help"])
    assert out["codes"] == [0, 0]
    assert out["loaded"] == {}, f"heavy modules imported (module: importer): {out['loaded']}"


def test_the_console_script_help_loads_no_torch_ray_faiss_or_the_store():
    """``raycompat --help`` as installed (pyproject.toml's console script) imports neither
    torch, Ray nor faiss, nor the store (pyarrow): the command modules load the store when a
    command opens one (``cli/store_options.py``), so --help costs Python and argparse, well
    under the 1.5x of ``python -c "import numpy, pyarrow"`` it is held to
    (benchmarks/cli_startup.py)."""
    script = Path(sys.executable).with_name("raycompat")
    entry = [str(script)] if script.exists() else ["-m", "raycompat.cli.app"]
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *entry, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: raycompat"), result.stderr
    imported = _imported(result.stderr)
    assert {"raycompat", "argparse"} <= imported  # the importtime lines were read
    heavy = {"torch", "ray", "faiss", "pyarrow"} & imported
    assert not heavy, f"raycompat --help imported {sorted(heavy)}"


def test_versions_and_vector_or_id_search_load_no_torch_or_ray(store):
    store, queries = store
    build_version_index(store, "g", "v1", use_gpu=False)  # a flat index, built beforehand
    where = ["--store", store.uri(), "--model", "m1", "--json"]
    out = cli_modules(
        ["versions", "g", "--store", store.uri()],
        ["search", "g", "--vectors", str(queries), *where],
        ["search", "g", "--vectors", str(queries), "--nprobe", "2", *where],
    )
    assert out["codes"] == [0, 0, 0]
    assert out["loaded"] == {}, f"heavy modules imported (module: importer): {out['loaded']}"
    # --ids builds Arrow arrays of the ids asked (pyarrow's pa.array imports pandas)
    out = cli_modules(["search", "g", "--ids", "i3", "i7", *where], heavy=("torch", "ray"))
    assert out["codes"] == [0] and out["loaded"] == {}, out["loaded"]


def test_a_search_without_an_index_reads_exactly_without_torch_or_ray(store):
    store, queries = store
    where = ["--store", store.uri(), "--model", "m1"]
    out = cli_modules(["search", "g", "--vectors", str(queries), *where], heavy=("torch", "ray"))
    assert out["codes"] == [0] and out["loaded"] == {}, out["loaded"]


def test_the_check_sees_a_top_level_import_and_names_the_importer():
    """Not vacuous: a module importing a watched one at its top is caught and named (faiss by
    raycompat.index.search_index: cheaper to load here than torch)."""
    out = cli_modules(["--help"], heavy=("faiss",), preload=["raycompat.index.search_index"])
    assert out["codes"] == [0] and out["loaded"] == {"faiss": "raycompat.index.search_index"}


# Loads and validates each job's config the way its console script does (--print-config: load,
# type-check, resolve outputs, print), then prints the heavy modules that are loaded.
_VALIDATE = r"""
import contextlib, io, json, sys
heavy, runs = json.loads(sys.argv[1])
from raycompat.config import load_config
from raycompat.config.upgrade import UpgradeConfig
load_config(UpgradeConfig, "configs/upgrade_mnist.yaml", ["upgrades.0.epochs=1"])
import importlib
codes = []
for job, argv in runs:
    main = importlib.import_module(f"raycompat.cli.jobs.{job}").main
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main(argv)
    except SystemExit as stop:
        codes.append(stop.code)
print(json.dumps({"codes": codes, "loaded": [m for m in heavy if m in sys.modules]}))
"""


def test_validating_the_demo_and_shipped_job_configs_loads_no_torch_or_ray():
    """The demo (the upgrade job's embedded MNIST history and configs/upgrade_mnist.yaml) and a
    shipped config of each other job validate with ``--print-config`` before torch or Ray
    load: a config typo answers in well under a second (benchmarks/cli_startup.py)."""
    runs = [
        ["upgrade", ["--print-config"]],
        ["upgrade", ["--config", "configs/upgrade_mnist.yaml", "--print-config"]],
        ["train", ["--config", "configs/train_mnist_cores.yaml", "--print-config"]],
        ["transform", ["--config", "configs/transform_fct.yaml", "--print-config"]],
        ["tune", ["--config", "configs/tune_hoc_lambda.yaml", "--print-config"]],
    ]
    out = run_script(_VALIDATE, [["torch", "ray"], runs])
    assert out == {"codes": [0] * len(runs), "loaded": []}


def run_script(script: str, payload: list) -> dict:
    """``python -c script payload-as-json`` from the checkout; the JSON of its last line."""
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(payload)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _imported(importtime_stderr: str) -> set[str]:
    """Top-level names of the modules a ``python -X importtime`` run imported."""
    lines = [line for line in importtime_stderr.splitlines() if line.startswith("import time:")]
    return {line.split("|")[-1].strip().split(".")[0] for line in lines[1:]}  # after the header


def test_an_upgrade_config_typo_is_one_line_before_torch_or_ray():
    """``python jobs/upgrade.py upgrades.0.method=bctx`` exits 2 with one line, having imported
    neither torch nor Ray (issue 23: the method registry, raycompat/methods/catalog.py)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "jobs/upgrade.py", "upgrades.0.method=bctx"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 2 and errors == [
        "upgrade.py: error: upgrades[0].method: unknown compatibility method 'bctx'; valid "
        "names: adapter, affine, bct, cores, dsimplex_fd, dsimplex_hoc, er, fct, ift, "
        "independent, l2, lwf, lwf_ft, nifcl_avg, nifcl_rw, procrustes, "
        "slerp; did you mean 'bct'?"
    ], result.stderr[-3000:]
    imported = _imported(result.stderr)
    assert {"raycompat", "yaml"} <= imported  # the importtime lines were read
    assert not {"torch", "ray"} & imported, f"imported {sorted({'torch', 'ray'} & imported)}"


# Each argv through the upgrade job as its console script runs it (run_main: one line, exit 2),
# then the heavy modules loaded.
_TYPOS = r"""
import contextlib, io, json, sys
from raycompat.cli.errors import run_main
from raycompat.cli.jobs.upgrade import main
heavy, runs = json.loads(sys.argv[1])
out = []
for argv in runs:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            run_main(main, argv)
    except SystemExit as stop:
        out.append([stop.code, stderr.getvalue().strip().splitlines()[-1]])
print(json.dumps({"runs": out, "loaded": [m for m in heavy if m in sys.modules]}))
"""


def test_upgrade_config_typos_of_every_kind_exit_2_without_torch_or_ray():
    """A wrong method option, class count, eval split, budget or FCT-only option, and a missing
    weights file: each one line, exit 2, and torch and Ray never load."""
    typos = {
        "upgrades.1.method_options.lamx=1": "upgrades[1].method_options: 'dsimplex_hoc' takes no",
        "upgrades.0.classes=11": "upgrades[0].classes=11 must be in 1..10",
        "upgrades.0.classes=8": "upgrades[0].classes=8 trains on class(es) [7]",
        "training.eval.split=closed_set": "eval.test_classes is only used with eval.split",
        "upgrades.2.partial_backfill.budget=1.5": "upgrades[2].partial_backfill.budget must",
        "upgrades.1.partial_backfill={budget: 0.2}": "upgrades[1].partial_backfill: method",
        "upgrades.0.baselines=[iftt]": "upgrades[0].baselines[0]: unknown compatibility method",
        "training.model.weights=/no/such/w.safetensors": "training.model.weights: no file at",
    }
    out = run_script(_TYPOS, [["torch", "ray"], [[t] for t in typos]])
    assert out["loaded"] == []
    for (code, line), expected in zip(out["runs"], typos.values(), strict=True):
        assert code == 2 and f"error: {expected}" in line, line
