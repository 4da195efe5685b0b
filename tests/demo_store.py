"""The store ``make demo`` leaves, written by the demo's own job at toy size, for the tests
that run documented commands on it (``tests/test_docs.py``, ``tests/cli/test_alias.py``).
``conftest.demo_stores`` writes each once per session."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

# The demo's own job and config (configs/upgrade_mnist.yaml) at toy size: 20 training images
# per digit, one epoch, one pipeline actor, no `ift` baseline beside m2 (no block reads it),
# and without m3 (at this size its partial backfill can pass, where `make demo` refuses it);
# the gallery is all 5,000 MNIST-5k images, as the demo's. The job runs in the test process
# on the session's Ray.
TOY_DEMO = ("training.data.options={per_class: 20}", "training.epochs=1", "pipeline.actors=1")


def _toy_demo_config(root: Path) -> Path:
    """configs/upgrade_mnist.yaml without m3 and without m2's baselines (the scalar settings
    go in as the job's own overrides, ``TOY_DEMO``)."""
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "upgrade_mnist.yaml").read_text())
    cfg["upgrades"] = [
        {**u, "baselines": []} for u in cfg["upgrades"] if u["model_version"] != "m3"
    ]
    path = root / "toy_demo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run_demo_job(root: Path, *overrides: str, retry: bool = False) -> dict:
    """``python jobs/upgrade.py`` on the toy demo config, its outputs under ``root/outputs``
    (the config's relative paths, as ``make demo`` resolves them in the checkout)."""
    sys.path.insert(0, str(ROOT))
    from jobs.upgrade import main

    config = _toy_demo_config(root)
    try:
        flags = ["--retry"] if retry else []
        argv = ["--config", str(config), "--output-root", str(root), *flags]
        return main([*argv, *TOY_DEMO, *overrides])
    finally:
        config.unlink()


def _drop_scratch(root: Path) -> None:
    """The job's training runs and work files: a block reads the store and the report only, and
    each block copies its fixture."""
    for scratch in ("runs", "work"):
        shutil.rmtree(root / "outputs" / "upgrade" / scratch, ignore_errors=True)


def write_demo_store(root: Path) -> None:
    """What ``make demo`` leaves in ``outputs/upgrade/store``, written by the demo's job
    (README, "What it decides"): gallery ``mnist`` of the 5,000 MNIST-5k ids,
    ``v1 = extract(m1)`` served by m1, m2 refused (a decision, no grant, no version). Plus
    ``digit.png`` and ``q.npy`` (two of v1's stored rows), the inputs the search examples
    name."""
    import pyarrow.parquet as pq
    from PIL import Image

    summary = _run_demo_job(root)
    assert summary["decisions"] == {"m1": "initial", "m2": "refuse"}, summary["decisions"]
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(28, 28), dtype=np.uint8)
    Image.fromarray(image, mode="L").save(root / "digit.png")
    part = sorted(
        (root / "outputs" / "upgrade" / "store" / "mnist" / "_data" / "v1").rglob("*.parquet")
    )[0]
    rows = pq.read_table(part, columns=["embedding"]).column("embedding").to_pylist()[:2]
    np.save(root / "q.npy", np.asarray(rows, dtype=np.float32))


def write_backfilled_demo_store(root: Path, demo: Path) -> None:
    """The demo's store after the documented second pair is made
    (``python jobs/upgrade.py --retry policy.on_incompatible=backfill``, docs/store.md "Named
    aliases"), by the job: ``v2 = extract(m2)`` served by m2 beside ``v1``."""
    shutil.copytree(demo, root, symlinks=True, dirs_exist_ok=True)
    summary = _run_demo_job(root, "policy.on_incompatible=backfill", retry=True)
    assert summary["decisions"] == {"m1": "initial", "m2": "backfill"}, summary["decisions"]


FIXTURES = ("demo_store", "demo_store_backfilled")


def write_demo_stores(tmp_path_factory) -> dict[str, Path]:
    """``FIXTURES`` by name, each written once by the demo's job; a test copies the one it
    uses (its commands may change the store)."""
    demo = tmp_path_factory.mktemp("demo_store")
    write_demo_store(demo)
    backfilled = tmp_path_factory.mktemp("demo_store_backfilled")
    write_backfilled_demo_store(backfilled, demo)
    for root in (demo, backfilled):
        _drop_scratch(root)
    return {"demo_store": demo, "demo_store_backfilled": backfilled}
