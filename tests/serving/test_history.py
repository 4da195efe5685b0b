"""``raycompat history GALLERY``: versions and who wrote them, every decision (refused and failed
ones with their reasons), query grants; adopted versions with their source; read-only."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from raycompat.cli.app import main
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.decisions import DecisionRecord, Decisions
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.store.commit.lease import LeaseOwner
from raycompat.store.commit.publish import with_operation
from tests.cli.test_startup import cli_modules

BUILDER = LeaseOwner(job="raysubmit_build1", host="builder-7", pid=4242, user="ana")


def publish(store: GalleryStore, version: str, model: str, owner: LeaseOwner | None = None):
    rows = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    info = VersionInfo(version, model, 4, False, f"{version} = extract({model})")
    info = with_operation(info, "extract", model=f"sha256:{model}", seed=0)
    staging = store.begin("faces", info, staging_name=f"job-{version}", owner=owner)
    staging.write_table(embedding_table([f"id{i}" for i in range(6)], rows), "part-0.parquet")
    return staging.commit(expected_rows=6)


def as_older_record(path: Path) -> None:
    """Rewrite a version record as a store written before ``by``/``operation`` had it."""
    raw = json.loads(path.read_text())
    for key in ("by", "operation", "parameters"):
        del raw[key]
    path.write_text(json.dumps(raw))


def adopt_record(store: GalleryStore, root: Path) -> None:
    """An adopted Delta snapshot's record, written as ``adopt`` would (no Ray; history reads
    only the record, never the external files)."""
    info = VersionInfo(
        "v3",
        "m1",
        4,
        False,
        "v3 = adopt(delta:tables/faces@3)",
        rows=5,
        files=["part-0.parquet"],
        created="2099-01-01T00:00:00+00:00",
        external={
            "root": str(root),
            "pins": [{"path": "part-0.parquet", "bytes": 100, "rows": 5, "mtime_ns": 1}],
            "table": {"format": "delta", "version": 3},
        },
    )
    store.backend.create_exclusive(store.path("faces", "_versions", "v3.json"), info.to_json())


@pytest.fixture
def root(tmp_path) -> str:
    """faces: v1 (by BUILDER), v2 (an older record: no ``by``, lease removed), v3 adopted;
    m2 refused then failed under the same config, m3 published; m1 and m3 hold grants."""
    store = GalleryStore(str(tmp_path / "store"))
    publish(store, "v1", "m1", owner=BUILDER)
    publish(store, "v2", "m3")
    shutil.rmtree(tmp_path / "store" / "faces" / "_data" / "v2" / "job-v2" / "_lease")
    as_older_record(tmp_path / "store" / "faces" / "_versions" / "v2.json")
    adopt_record(store, tmp_path / "tables" / "faces")
    catalog = Catalog(store)
    for model in ("m1", "m3"):
        catalog.register_model(ModelRecord(model, f"/models/{model}", 4))
    catalog.grant(QueryGrant("faces", "v1", "m1", "extracted"))
    catalog.grant(QueryGrant("faces", "v2", "m3", "transformed", {"cross": 0.8125}))
    decisions = Decisions(store)
    refusal = "ECC fails: M(m2, v1) = 0.41 <= M(m1, v1) = 0.52 on the cross-test"
    decisions.put(DecisionRecord("faces", "m2", "refused", refusal, "d1", "m1", {"ecc": False}))
    decisions.put(DecisionRecord("faces", "m2", "failed", "RuntimeError: CUDA OOM", "d1", "m1"))
    decisions.put(DecisionRecord("faces", "m3", "published", "ECC holds", "d9", "m1"))
    return store.root


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["history", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_tells_every_version_decision_and_grant(root, tmp_path, capsys):
    code, out, _ = run(capsys, "faces", "--store", root, "--json")
    history = json.loads(out)
    assert code == 0 and "corrupt" not in history
    versions = {v["version"]: v for v in history["versions"]}
    assert [v["version"] for v in history["versions"]] == ["v1", "v2", "v3"]  # oldest first
    assert versions["v1"]["written_by"] == [BUILDER.describe()]
    assert versions["v1"]["by"] == asdict(BUILDER)  # the lease's owner, kept in the record
    assert versions["v1"]["operation"] == "extract"
    assert versions["v1"]["parameters"] == {"model": "sha256:m1", "seed": 0}
    assert versions["v2"]["written_by"] == ["unknown"]  # an older record, and its lease is gone
    assert (versions["v2"]["by"], versions["v2"]["operation"]) == (None, None)
    assert (versions["v1"]["rows"], versions["v1"]["width"], versions["v1"]["dtype"]) == (
        6,
        4,
        "float32",
    )
    assert versions["v1"]["external"] is None
    assert versions["v3"]["external"] == {
        "root": str(tmp_path / "tables" / "faces"),
        "table": {"format": "delta", "version": 3},
    }
    got = [
        (d["model_version"], d["attempt"], d["outcome"], d["standing"])
        for d in history["decisions"]
    ]
    assert got == [
        ("m2", 1, "refused", True),  # a failed retry under the same config does not stand
        ("m2", 2, "failed", False),
        ("m3", 1, "published", True),
    ]
    assert history["decisions"][0]["reason"].startswith("ECC fails: M(m2, v1) = 0.41")
    assert history["decisions"][1]["reason"] == "RuntimeError: CUDA OOM"
    me = LeaseOwner()  # who recorded the decisions: this process, its job id and OS user
    assert history["decisions"][0]["by"] == asdict(me)
    assert history["decisions"][0]["recorded_by"] == f"{me.job} ({me.user}@{me.host})"
    grants = [(g["model_version"], g["gallery_version"], g["relation"]) for g in history["grants"]]
    assert grants == [("m1", "v1", "extracted"), ("m3", "v2", "transformed")]
    assert history["grants"][1]["evidence"] == {"cross": 0.8125}


def test_table_shows_each_section_with_full_reasons(root, capsys):
    code, out, _ = run(capsys, "faces", "--store", root)
    assert code == 0
    for heading in ("gallery faces", "versions", "decisions", "query grants"):
        assert f"\n{heading}\n" in f"\n{out}"
    assert "job 'raysubmit_build1' on host 'builder-7' (pid 4242) as user 'ana'" in out
    assert "\nv1 extract: model=sha256:m1 seed=0\n" in out  # the operation's parameters
    assert "ECC fails: M(m2, v1) = 0.41 <= M(m1, v1) = 0.52 on the cross-test" in out  # uncut
    assert "RuntimeError: CUDA OOM" in out
    assert "adopted v3 from " in out and "tables/faces @delta v3" in out
    assert "cross=0.8125" in out


def test_unknown_gallery_is_one_line_listing_the_galleries(root, capsys):
    code, out, err = run(capsys, "face", "--store", root)
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert "no gallery 'face'" in err and "galleries are faces" in err
    assert "did you mean 'faces'?" in err


def test_a_corrupt_decision_is_named_and_the_rest_still_listed(root, capsys):
    bad = Path(root) / "faces" / "_decisions" / "m3" / "00000001.json"
    bad.write_text('{"gallery": "faces"')
    code, out, err = run(capsys, "faces", "--store", root, "--json")
    history = json.loads(out)
    assert code == 1 and "corrupt record skipped" in err
    assert [d["model_version"] for d in history["decisions"]] == ["m2", "m2"]
    assert len(history["versions"]) == 3 and "00000001.json" in history["corrupt"][0]["error"]


def _listing(root: str) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root``: relative path -> (size, mtime in ns)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            stat = os.stat(path)
            found[os.path.relpath(path, root)] = (stat.st_size, stat.st_mtime_ns)
    return found


def test_history_never_writes_to_the_store(root, capsys):
    before = _listing(root)
    for argv in (["faces"], ["faces", "--json"], ["nope"]):
        run(capsys, *argv, "--store", root)
    assert _listing(root) == before


def test_history_loads_neither_torch_nor_ray(root):
    out = cli_modules(["history", "faces", "--store", root], heavy=("torch", "ray"))
    assert out["codes"] == [0] and out["loaded"] == {}, out["loaded"]
