"""``jobs/upgrade.py`` the way users run it: ``ray job submit`` to a real head, and directly.

- submitted to the head of docs/cluster.md's local-cluster recipe, started by the recipe's own
  commands (on free ports, loopback only): a toy history (initial model + gallery, an FCT
  upgrade) must end SUCCEEDED with the versions, catalog and report published; submitting it
  again publishes nothing new;
- the recipe's submit, logs and status commands as written, on a history whose second model
  stands refused under ``policy.on_incompatible=refuse``, with ``--fail-on-refuse``: a refusal
  the policy expects, so the submitter sees SUCCEEDED and exit 0 (README.md, "Exit status");
- an incompatible candidate (independent training with a learned head) is refused and leaves the
  store untouched; rerunning with ``policy.on_incompatible=backfill`` re-extracts instead.

The in-process tests share one tiny history run twice from empty stores (``tiny_histories``):
the reproducibility test compares the two runs, the refusal test backfills the second one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = str(Path(sys.executable).parent)


PER_CLASS = 150  # MNIST-5k images per digit in the in-process histories: a 1,500-row gallery
ROWS = 10 * PER_CLASS


def toy_config(
    tmp: Path, upgrades: list[dict], per_class: int = PER_CLASS, epochs: int = 1, **extra
) -> dict:
    return {
        "name": "toy",
        "store": {"root": str(tmp / "store"), "gallery": "digits"},
        "gallery_images": {
            "kind": "dataset",
            "name": "mnist5k",
            "options": {"per_class": per_class},
        },
        "training": {
            "data": {"name": "mnist5k", "options": {"per_class": per_class}},
            "eval": {
                "split": "closed_set",
                "test_classes": [],
                "test_fraction": 0.25,
                "val_fraction": 0.1,
            },
            "run": {"storage_path": str(tmp / "runs")},
            "epochs": epochs,
            "batch_size": 64,
            # as the demo's: one worker trains in one Ray task (cluster/train/task_run.py),
            # the job's logic is what these tests check (2-worker runs: tests/cluster/train)
            "scaling": {"num_workers": 1},
        },
        "upgrades": upgrades,
        # two files per version: the checks read a multi-part version
        "pipeline": {"rows_per_file": 5 * per_class, "batch_size": 500, "actors": 1},
        "report_dir": str(tmp / "report"),
        "work_dir": str(tmp / "work"),
        **extra,
    }


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


ACTIVATE = "source .venv/bin/activate"
DOCUMENTED_PORTS = ("6390", "8275")  # the recipe's --port and --dashboard-port
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def local_cluster_recipe() -> list[str]:
    """The commands of docs/cluster.md's local-cluster block, continuation lines joined."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    section = text[text.index("## A local cluster") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [line.strip() for line in block.replace("\\\n", " ").splitlines()]
    return [c for c in commands if c]


def run_documented(commands: list[str], replace: dict[str, str], env: dict) -> dict[str, str]:
    """Run ``commands`` in one bash from the repository root, as a reader pastes them, with the
    documented ports (and anything else in ``replace``) swapped; ``{command: its output}``.
    ``source .venv/bin/activate`` is dropped where the venv lives elsewhere (``env`` has its
    ``bin`` first on PATH anyway)."""
    if not (ROOT / ".venv" / "bin" / "activate").is_file():
        commands = [c for c in commands if c != ACTIVATE]
    script = []
    for index, command in enumerate(commands):
        for documented, here in replace.items():
            command = command.replace(documented, here)
        script += [f"echo '@@@ {index}'", command]
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    shown = ANSI.sub("", done.stdout)  # what a reader sees: Ray's CLI colours its output
    return dict(zip(commands, re.split(r"^@@@ \d+\n", shown, flags=re.M)[1:], strict=False))


@pytest.fixture(scope="module")
def ray_head():
    """The recipe's head (``source .venv/bin/activate``, ``ray start --head ...``) on free
    ports, with what keeps it apart from the session's other Ray runtimes appended: its own temp
    dir and ports for every other service. Yields ``(dashboard address, env, {documented port:
    port})``. Stopped by killing exactly its own processes (the recipe's ``ray stop`` would also
    stop the session's other Ray runtime)."""
    temp_dir = f"/tmp/rh{uuid.uuid4().hex[:8]}"
    gcs, dash, agent, grpc, metrics, env_agent, node, objm = _free_ports(8)
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    for name in [k for k in env if k.startswith("RAY_")]:
        env.pop(name)
    recipe = local_cluster_recipe()
    assert recipe[:2] == [
        ACTIVATE,
        "ray start --head --port=6390 --dashboard-port=8275 --num-cpus=4",
    ]
    apart = [
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={env_agent}",
        f"--node-manager-port={node}",
        f"--object-manager-port={objm}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    ports = dict(zip(DOCUMENTED_PORTS, (str(gcs), str(dash)), strict=True))
    started = run_documented([recipe[0], f"{recipe[1]} {' '.join(apart)}; echo rc=$?"], ports, env)
    assert list(started.values())[-1].rstrip().endswith("rc=0"), started
    address = f"http://127.0.0.1:{dash}"
    try:
        yield address, env, ports
    finally:
        for proc in psutil.process_iter(["cmdline"]):
            if any(temp_dir in part for part in proc.info["cmdline"] or []):
                proc.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit(address: str, env: dict, config: Path, submission_id: str) -> str:
    out = subprocess.run(
        [
            f"{VENV_BIN}/ray",
            "job",
            "submit",
            f"--address={address}",
            "--working-dir",
            str(ROOT),
            f"--submission-id={submission_id}",
            "--",
            "python",
            "jobs/upgrade.py",
            "--config",
            str(config),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    from ray.job_submission import JobStatus, JobSubmissionClient

    status = JobSubmissionClient(address).get_job_status(submission_id)
    assert status == JobStatus.SUCCEEDED, out.stdout[-4000:] + out.stderr[-4000:]
    return out.stdout


def test_submitted_history_publishes_and_resubmitting_is_a_no_op(ray_head, tmp_path):
    """The tiny history (m1 initial, m2 refused: :func:`tiny_config`) through ``ray job
    submit`` into an empty store, then submitted again. Each action's publication is checked
    in the job's in-process tests (transform and partial backfill in
    :func:`test_an_fct_upgrade_with_a_partial_backfill_publishes_half_the_gallery_re_extracted`,
    backfill in :func:`test_incompatible_upgrade_is_refused_then_backfilled_on_request`); here,
    what a submitted job writes and that resubmitting it changes nothing."""
    address, env, _ = ray_head
    config = tiny_config(tmp_path)
    started = time.monotonic()
    submit(address, env, config, "upgrade-toy-1")
    store = GalleryStore(str(tmp_path / "store"))
    catalog = Catalog(store)
    report = json.loads((tmp_path / "report" / "toy" / "report.json").read_text())
    decisions = report["decisions"]
    versions = {v.version: v for v in store.versions("digits")}
    grants = {g.model_version: g for g in catalog.grants("digits")}

    assert decisions == {"m1": "initial", "m2": "refuse"}
    assert sorted(versions) == ["v1"] and versions["v1"].model_version == "m1"
    assert versions["v1"].rows == ROWS and grants["m1"].relation == "extracted"
    assert sorted(grants) == ["m1"]  # the refused m2 gets no grant
    assert len(report["matrix"]) == 2
    for name in ("report.md", "matrix.png", "matrix.json", "config.yaml"):
        assert (tmp_path / "report" / "toy" / name).stat().st_size > 0
    first = {
        "versions": sorted(versions),
        "models": [vars(m) for m in catalog.models()],
        "grants": sorted(vars(g)["created"] for g in grants.values()),
    }

    written = {p.name: p.read_bytes() for p in (tmp_path / "report" / "toy").iterdir()}
    out = submit(address, env, config, "upgrade-toy-2")
    assert sorted(v.version for v in store.versions("digits")) == first["versions"]
    assert [vars(m) for m in catalog.models()] == first["models"]
    assert sorted(g.created for g in catalog.grants("digits")) == first["grants"]
    # every entry resumed, so the report is left byte for byte as it was (issue 40, item 4)
    assert "nothing new was published: the report in" in out, out[-3000:]
    again = {p.name: p.read_bytes() for p in (tmp_path / "report" / "toy").iterdir()}
    assert again == written
    print(f"toy history submitted twice in {time.monotonic() - started:.0f} s: {decisions}")


def tiny_config(where: Path) -> Path:
    """A tiny open-set history: m1 and m2 trained independently with learned linear heads (no
    shared feature space, so m2 is refused); its config file."""
    cfg = toy_config(
        where,
        [
            {"model_version": "m1", "classes": 3, "method": "independent"},
            {"model_version": "m2", "classes": 5, "method": "independent"},
        ],
    )
    cfg["training"]["eval"] = {"split": "open_set", "test_classes": [7, 8, 9]}
    cfg["training"]["model"] = {
        "backbone": "lenetpp",
        "head": "linear",
        "num_classes": 10,
        "embed_dim": 8,
    }
    config = where / "tiny.yaml"
    where.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(cfg))
    return config


def tiny_run(where: Path, *extra: str) -> dict:
    """The tiny history (:func:`tiny_config`) run in-process on the session's Ray."""
    sys.path.insert(0, str(ROOT))
    from jobs.upgrade import main

    return main(["--config", str(tiny_config(where)), *extra])


@pytest.fixture(scope="module")
def tiny_histories(tiny_history):
    """``(root, first, second)``: the tiny history run from empty stores in ``root/a`` (the
    session's :func:`~tests.conftest.tiny_history`) and ``root/b``, and the two summaries. The
    reproducibility test reruns ``a``; the refusal test backfills ``b`` (which adds v2 and
    leaves v1 as it was)."""
    root, first = tiny_history
    second = tiny_run(root / "b")
    return root, first, second


def test_incompatible_upgrade_is_refused_then_backfilled_on_request(tiny_histories):
    root, _, summary = tiny_histories
    where = root / "b"
    store = GalleryStore(str(where / "store"))
    catalog = Catalog(store)
    assert summary["decisions"] == {"m1": "initial", "m2": "refuse"}
    assert [v.version for v in store.versions("digits")] == ["v1"]
    assert [m.model_version for m in catalog.models()] == ["m1"]
    assert [g.model_version for g in catalog.grants("digits")] == ["m1"]
    assert not (where / "store" / "_models" / "m2").exists()
    text = (where / "report" / "toy" / "report.md").read_text()
    assert "**refuse**" in text and "ECC fails" in text
    # One number per cell: the decision scored the matrix's arrays; unmeasured cells are null.
    report = json.loads((where / "report" / "toy" / "report.json").read_text())
    direct = next(o for o in report["outcomes"] if o["model_version"] == "m2")["evidence"]
    direct = direct["direct"]
    (m11, m12), (m21, m22) = summary["matrix"]
    assert (direct["old_self"], direct["cross"], direct["new_self"]) == (m11, m21, m22)
    assert m12 is None and direct["gallery"] == ""
    assert summary["negative_flips"]["m2"]["negative_flip_rate"] == direct["negative_flip_rate"]

    folder = where / "report" / "toy"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    summary = tiny_run(where, "policy.on_incompatible=backfill")
    assert summary["decisions"] == {"m1": "initial", "m2": "backfill"}
    # the backfill rewrote the report; the earlier one moved aside whole, unchanged
    (earlier,) = (folder / "earlier").iterdir()
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before
    assert "**backfill**" in (folder / "report.md").read_text()
    v2 = store.version("digits", "v2")
    assert v2.model_version == "m2" and v2.lineage == "v2 = extract(m2)" and v2.rows == ROWS
    assert catalog.queryable_version("digits", "m2").relation == "extracted"


def adopted_beside_the_history(root: Path, tmp_path: Path, gallery, version, model):
    """``(history folder, store root)``: a copy of the tiny history ``root / "a"`` whose store
    also holds a 6-row, 4-d Parquet table adopted as ``gallery``/``version`` by ``model``
    (registered without weights), through ``raycompat adopt``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raycompat.cli.app import main as cli

    where = tmp_path / "history"
    shutil.copytree(root / "a", where)
    x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4)
    (tmp_path / "table").mkdir()
    pq.write_table(
        pa.table({"id": np.arange(6), "embedding": embedding}), tmp_path / "table" / "p.parquet"
    )
    store_root = str(where / "store")
    adopt = ["adopt", gallery, str(tmp_path / "table"), "--store", store_root]
    assert cli([*adopt, "--version", version, "--model", model]) == 0
    return where, store_root


def test_a_table_adopted_into_the_store_leaves_its_upgrade_job_working(
    tiny_histories, tmp_path, capsys
):
    """Issue 40, item 1: ``raycompat adopt`` registers a model without weights (``extmodel``,
    gallery ``ext``); the upgrade job on the same store loaded every registered model's weights
    and failed ("model 'extmodel' is registered but has no files"). It loads only its own
    gallery's models: a rerun of the tiny history publishes nothing new and reports the same
    decisions and models, without a row for the adopted model."""
    root, first, _ = tiny_histories
    where, store_root = adopted_beside_the_history(root, tmp_path, "ext", "v1", "extmodel")
    capsys.readouterr()
    assert not Catalog(GalleryStore(store_root)).model("extmodel").has_weights

    summary = tiny_run(where)
    assert summary["decisions"] == first["decisions"] == {"m1": "initial", "m2": "refuse"}
    assert summary["names"] == first["names"] == ["m1", "m2"]  # no row for extmodel
    assert [v.version for v in GalleryStore(store_root).versions("digits")] == ["v1"]


def test_a_version_adopted_into_the_gallery_since_leaves_its_decisions_standing(
    tiny_histories, tmp_path, capsys
):
    """Issue 52, item 3: a table adopted into the history's own gallery after the history ran
    became the gallery model the next rerun judged m2 against: the log said "judged again (its
    config changed)" although nothing had, the rerun failed with NoWeightsError (the adopted
    model has no weights) and m2's refusal was replaced by "failed against ext". A decision
    made under the same config against the gallery model it was judged against stands."""
    from raycompat.store.catalog.decisions import Decisions

    root, first, _ = tiny_histories
    where, store_root = adopted_beside_the_history(root, tmp_path, "digits", "v9", "ext")
    capsys.readouterr()
    store = GalleryStore(store_root)
    before = Decisions(store).attempts("digits", "m2")

    summary = tiny_run(where)
    assert summary["decisions"] == first["decisions"] == {"m1": "initial", "m2": "refuse"}
    after = Decisions(store).attempts("digits", "m2")
    assert after == before and after[-1].outcome == "refused" and after[-1].against == "m1"
    assert [v.version for v in store.versions("digits")] == ["v1", "v9"]


def test_a_transformed_version_that_fails_its_check_is_not_published(ray_local, tmp_path):
    """A transformation that scrambles the gallery: the staged rows fail the new model's
    cross-test, the staging area is aborted, nothing is published and the decision becomes a
    refusal that says why."""
    import numpy as np
    import torch

    from raycompat.cluster.pipelines import RunOptions
    from raycompat.cluster.upgrade.job import Upgrader
    from raycompat.config.upgrade import UpgradeConfig
    from raycompat.evaluation import EvalSet
    from raycompat.store import VersionInfo, embedding_table
    from raycompat.transformations import FCTTransformation, save_transformation
    from raycompat.upgrade.evaluate import EvalData
    from raycompat.upgrade.policy import Decision

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(5), 8)
    features = (np.eye(5)[labels] + 0.05 * rng.normal(size=(40, 5))).astype(np.float32)
    store = GalleryStore(str(tmp_path / "store"))
    staging = store.begin("mnist", VersionInfo("v1", "m1", 5, False, "v1 = extract(m1)"))
    staging.write_table(embedding_table(np.arange(40), features), "part-0.parquet")
    v1 = staging.commit()
    torch.manual_seed(0)
    save_transformation(tmp_path / "m3", FCTTransformation(5, 0, 5, width=8))  # untrained h
    data = EvalData(None, np.arange(40), EvalSet(labels), "identification", "cosine", True, 8)
    assert data.score(features, features) == 1.0  # the old self-test the rows must beat
    cfg = UpgradeConfig(pipeline=RunOptions(rows_per_file=40, batch_size=40, actors=1))
    upgrader = Upgrader(cfg, store, Catalog(store), data)
    decision, version = upgrader.publisher.act(
        2,
        cfg.upgrades[2],
        Decision("transform", "ok"),
        str(tmp_path / "m3"),
        features,
        v1,
        None,
        0.5,
        {},
        "m1",
    )
    assert decision.action == "refuse" and version is None
    assert "failed its check before publishing" in decision.reason
    assert "not above the old self-test 50.00%" in decision.reason
    assert [v.version for v in store.versions("mnist")] == ["v1"]
    assert Catalog(store).models() == []
    assert not any((tmp_path / "store" / "mnist" / "_data" / "v3").glob("**/*.parquet"))


def test_the_same_config_and_seed_give_the_same_matrix_bit_for_bit(tiny_histories):
    """Two runs of a tiny open-set history from empty stores: every matrix cell, every decision
    and every stored row equal, bit for bit (seeded splits, data order, initialisation and Ray
    Data chunking). A third run over the first store re-judges nothing: the refused upgrade is
    skipped, and says so."""
    import numpy as np

    root, first, second = tiny_histories
    assert first["matrix"] == second["matrix"] and first["names"] == ["m1", "m2"]
    assert first["decisions"] == second["decisions"] == {"m1": "initial", "m2": "refuse"}
    assert first["split"].startswith("open-set")
    rows = [GalleryStore(str(root / s / "store")).read("digits", "v1").sort_by("id") for s in "ab"]
    np.testing.assert_array_equal(
        np.stack(rows[0].column("embedding").to_numpy(zero_copy_only=False)),
        np.stack(rows[1].column("embedding").to_numpy(zero_copy_only=False)),
    )

    folder = root / "a" / "report" / "toy"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    again = tiny_run(root / "a")
    assert again["decisions"] == first["decisions"] and again["report_written"] is False
    assert again["matrix"] == first["matrix"]  # the skipped candidate keeps its row
    # nothing new: the report is left byte for byte as it was
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


def test_an_fct_upgrade_with_a_partial_backfill_publishes_half_the_gallery_re_extracted(
    ray_local, tmp_path, capsys
):
    """FastFill through the job: m2 (fct, partial_backfill budget 0.5) learns h with its
    uncertainty, the report shows the backfill curves of the test images, and v2 is h(v1)
    with exactly half of its rows re-extracted by m2, published with its grant and lineage. A
    rerun publishes nothing new and reports the same action."""
    import pyarrow.compute as pc

    sys.path.insert(0, str(ROOT))
    from jobs.upgrade import main
    from raycompat.cli.app import main as cli

    config = tmp_path / "partial.yaml"
    cfg = toy_config(
        tmp_path,
        [
            {"model_version": "m1", "classes": 4, "method": "independent"},
            {
                "model_version": "m2",
                "classes": 10,
                "method": "fct",
                "fct": {"width": 64, "epochs": 6, "batch_size": 128},
                "partial_backfill": {"budget": 0.5, "order": "uncertainty"},
            },
        ],
    )
    config.write_text(yaml.safe_dump(cfg))
    started = time.monotonic()
    summary = main(["--config", str(config)])
    assert summary["decisions"] == {"m1": "initial", "m2": "partial_backfill"}

    store = GalleryStore(str(tmp_path / "store"))
    catalog = Catalog(store)
    v2 = store.version("digits", "v2")
    assert v2.model_version == "m2" and v2.rows == ROWS
    assert "budget=0.5" in v2.lineage and "order=uncertainty" in v2.lineage, v2.lineage
    rows = store.read("digits", "v2", ["provenance", "uncertainty"])
    extracted = pc.sum(pc.equal(rows.column("provenance"), "extracted")).as_py()
    assert extracted == round(0.5 * ROWS)
    grant = catalog.queryable_version("digits", "m2")
    assert (grant.gallery_version, grant.relation) == ("v2", "transformed")
    assert grant.evidence["partial_backfill"] == {
        "budget": 0.5,
        "order": "uncertainty",
        "extracted": ROWS // 2,
    }
    assert "partial backfill" in grant.evidence["reason"]

    report_dir = tmp_path / "report" / "toy"
    body = json.loads((report_dir / "report.json").read_text())
    m2 = next(o for o in body["outcomes"] if o["model_version"] == "m2")
    curves = m2["backfill"]["curves"]
    assert set(curves) == {"uncertainty", "random", "oracle"}
    # f = 1 is the new/new self-test, whatever the order
    assert curves["uncertainty"]["top1"][-1] == pytest.approx(m2["evidence"]["direct"]["new_self"])
    # the partially backfilled test gallery: the curve's value at the budget, and its NFR
    backfilled = m2["evidence"]["backfilled"]
    at_budget = m2["backfill"]["summary"]["uncertainty"]["top1_at_budget"]
    assert backfilled["cross"] == pytest.approx(at_budget, abs=1e-12)
    flips = summary["negative_flips"]["m2"]
    assert flips["negative_flip_rate"] == backfilled["negative_flip_rate"]
    assert (report_dir / "backfill_m2.png").stat().st_size > 0
    assert cli(["report", str(report_dir)]) == 0
    text = capsys.readouterr().out
    assert "## Partial backfill" in text and "On the test images (closed-set" in text
    assert "![partial backfill of m2](backfill_m2.png)" in text
    print(f"partial backfill history in {time.monotonic() - started:.0f} s")

    before = {p.name: p.read_bytes() for p in report_dir.iterdir() if p.is_file()}
    again = main(["--config", str(config)])
    assert again["decisions"] == summary["decisions"]
    assert [v.version for v in store.versions("digits")] == ["v1", "v2"]
    # nothing new: the report, its partial-backfill section and its plot are as they were
    assert {p.name: p.read_bytes() for p in report_dir.iterdir() if p.is_file()} == before


def test_the_documented_recipe_ends_a_refusal_the_policy_expects_with_exit_0(
    ray_head, tiny_histories, tmp_path
):
    """docs/cluster.md's ``export``, ``ray job submit ... --fail-on-refuse``, ``ray job logs``
    and ``ray job status``, as written, against the recipe's head, on a copy of the tiny history
    (m2 stands refused under this config, so nothing is trained again): the refusal is the
    answer of its policy (``on_incompatible=refuse``), so even with ``--fail-on-refuse`` the job
    SUCCEEDS: the log's last line, the job's status and its recorded exit code say 0."""
    from ray.job_submission import JobSubmissionClient

    address, env, ports = ray_head
    root, first, _ = tiny_histories
    assert first["decisions"]["m2"] == "refuse"
    where = tmp_path / "history"
    shutil.copytree(root / "a", where)
    config = tiny_config(where)
    recipe = local_cluster_recipe()
    assert recipe[-1] == "ray stop"  # not run: it would stop every Ray here (the fixture stops)
    started = time.monotonic()
    out = run_documented(recipe[2:-1], {**ports, "configs/upgrade_mnist.yaml": str(config)}, env)
    submit, follow, last, status = (
        next(o for c, o in out.items() if c.startswith(prefix))
        for prefix in (
            "ray job submit",
            "ray job logs -f",
            "ray job logs upgrade-1 |",
            "ray job status",
        )
    )
    line = "raycompat: exit 0 (ok)"
    assert last.strip() == line, "\n".join(out.values())[-6000:]
    assert f"{line}\n" in submit and "succeeded" in submit.lower()  # seen while it waited
    assert f"{line}\n" in follow  # then Ray's own "Job 'upgrade-1' succeeded"
    assert "succeeded" in status.lower() and "failed" not in status.lower(), status
    assert JobSubmissionClient(address).get_job_info("upgrade-1").driver_exit_code == 0
    print(f"the recipe's refused submission in {time.monotonic() - started:.0f} s")


def test_an_entry_without_compatible_training_is_decided_on_its_query_map(ray_local, tmp_path):
    """Issue 41, item 4: ``method: procrustes`` trains m2 on its own (as ``independent``), fits
    the map from m2's space into m1's on a sample of about ``map.pairs`` stored rows paired with
    m2's embeddings of their images (none of the rows it is scored on), and
    decides on m2's mapped queries against the stored gallery (ECC, flips) as it would on a
    compatible model's. The tiny history's m2 trained alone is refused (see above); its map is
    what is judged here, and the report shows the kind, the pairs and the fit's residual.
    ``method: slerp`` (m3, judged against the same v1 once m2 is refused) is decided the same
    way: both kinds in one history, so the job's fixed cost is paid once."""
    sys.path.insert(0, str(ROOT))
    from jobs.upgrade import main

    config = tiny_config(tmp_path)
    cfg = yaml.safe_load(config.read_text())
    kinds = {"m2": "procrustes", "m3": "slerp"}
    cfg["upgrades"][1:] = [
        {"model_version": m, "classes": c, "method": kinds[m], "map": {"pairs": 400}}
        for m, c in (("m2", 5), ("m3", 6))
    ]
    config.write_text(yaml.safe_dump(cfg))
    summary = main(["--config", str(config)])
    report = json.loads((tmp_path / "report" / "toy" / "report.json").read_text())
    store = GalleryStore(str(tmp_path / "store"))
    assert [v.version for v in store.versions("digits")] == ["v1"]  # nothing rewritten
    # one epoch of an 8-d LeNet on 3, 5 and 6 classes: the mapped queries do not reach m1's
    # own score, so ECC fails on them too and the default policy refuses, saying why
    assert summary["decisions"] == {"m1": "initial", "m2": "refuse", "m3": "refuse"}
    assert not (tmp_path / "store" / "digits" / "_adapters").exists()  # nothing stored
    text = (tmp_path / "report" / "toy" / "report.md").read_text()
    for model, kind in kinds.items():
        outcome = next(o for o in report["outcomes"] if o["model_version"] == model)
        adapted, direct = outcome["evidence"]["adapted"], outcome["evidence"]["direct"]
        assert adapted["kind"] == kind and 300 <= adapted["pairs"] <= 500  # 400 expected
        assert adapted["relative_residual"] is not None and 0 <= adapted["relative_residual"] < 1
        assert adapted["old_self"] == direct["old_self"]  # the same gallery, the same old model
        assert adapted["cross"] != direct["cross"]  # the mapped queries, not the raw ones
        assert not adapted["ecc"] and "ECC fails" in outcome["reason"]
        line = f"{model} ({kind}) through its {kind} map on {adapted['pairs']} pairs, relative"
        assert line in text


def test_a_map_of_the_gallery_forward_is_published_or_refused_as_h_is(ray_local, tmp_path):
    """Issue 41, item 2's gallery side in the job: ``map.direction: gallery`` fits the map from
    m1's space into m2's, saves it as m2's h, and decides on m2's queries against h(stored
    test rows), as for FCT; a transform writes v2 = h(v1) with the transform pipeline."""
    sys.path.insert(0, str(ROOT))
    from jobs.upgrade import main

    config = tiny_config(tmp_path)
    cfg = yaml.safe_load(config.read_text())
    cfg["upgrades"][1] = {
        "model_version": "m2", "classes": 5, "method": "affine",
        "map": {"pairs_fraction": 0.5, "direction": "gallery"},
    }  # fmt: skip
    config.write_text(yaml.safe_dump(cfg))
    summary = main(["--config", str(config)])
    report = json.loads((tmp_path / "report" / "toy" / "report.json").read_text())
    m2 = next(o for o in report["outcomes"] if o["model_version"] == "m2")
    mapped = m2["evidence"]["transformed"]
    assert (mapped["kind"], mapped["lam"]) == ("affine", 0.0)
    # half the stored rows the job does not score on, in expectation (binomial sd <= 4%)
    from raycompat.cluster.upgrade.steps import held_out_rows
    from raycompat.config import load_config
    from raycompat.config.upgrade import UpgradeConfig

    rows = GalleryStore(str(tmp_path / "store")).version("digits", "v1").rows
    eligible = rows - len(held_out_rows(load_config(UpgradeConfig, str(config))))
    assert abs(mapped["pairs"] - eligible / 2) <= 4 * (eligible / 4) ** 0.5
    assert "adapted" not in m2["evidence"]
    # h(v1)'s test rows lift m2's cross-test above the raw one (against v1), still under
    # M(m1, m1): ECC fails on h(gallery) and the default policy refuses, as for FCT
    assert summary["decisions"] == {"m1": "initial", "m2": "refuse"}
    assert not mapped["ecc"] and mapped["cross"] > m2["evidence"]["direct"]["cross"]
    assert "ECC fails" in m2["reason"] and "h(" in m2["reason"]
    store = GalleryStore(str(tmp_path / "store"))
    assert [v.version for v in store.versions("digits")] == ["v1"]
