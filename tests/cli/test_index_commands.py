"""``raycompat index build|verify`` and a read-only ``raycompat search`` (issue 23, items 4 and
6; ``raycompat/cli/commands/index.py``): search never writes to the store, the index is built
by ``index build``, and ``index verify`` checks its files and estimates recall@10."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

from raycompat.cli.app import main
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

ROWS, WIDTH = 400, 8
pytestmark = pytest.mark.usefixtures("one_faiss_thread")


@pytest.fixture
def store(tmp_path) -> GalleryStore:
    """g/v1: 400 unit rows ``r0..r399`` in two part files, queried by m1; no index."""
    store = GalleryStore(str(tmp_path / "store"))
    x = np.random.default_rng(0).normal(size=(ROWS, WIDTH)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    staging = store.begin("g", VersionInfo("v1", "m1", WIDTH, True, "v1 = extract(m1)"))
    for part in range(2):
        rows = range(part * ROWS // 2, (part + 1) * ROWS // 2)
        table = embedding_table([f"r{i}" for i in rows], x[rows.start : rows.stop])
        staging.write_table(table, f"part-{part}.parquet")
    staging.commit(expected_rows=ROWS)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", "", WIDTH, method="independent"))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted"))
    return store


def files(root: str) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: relative path -> (bytes, mtime_ns)."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            st = os.stat(os.path.join(folder, name))
            out[os.path.relpath(os.path.join(folder, name), root)] = (st.st_size, st.st_mtime_ns)
    return out


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def search(capsys, store: GalleryStore, *ids: str) -> tuple[int, str, str]:
    argv = ["--store", store.uri(), "--model", "m1", "--json"]
    return cli(capsys, "search", "g", "--ids", *ids, "-k", "3", *argv)


def index(capsys, store: GalleryStore, action: str, *argv: str) -> tuple[int, str, str]:
    return cli(capsys, "index", action, "g", "--version", "v1", "--store", store.uri(), *argv)


def test_search_without_an_index_reads_exactly_and_leaves_the_store_identical(store, capsys):
    before = files(store.uri())
    code, out, err = search(capsys, store, "r5", "r123")
    assert code == 0 and [r["ids"][0] for r in json.loads(out)["results"]] == ["r5", "r123"]
    assert "no index is published; searched its 400 rows exactly" in err
    assert "raycompat index build g --version v1" in err
    assert files(store.uri()) == before


def test_search_with_a_corrupt_index_reads_exactly_and_writes_nothing(store, capsys):
    assert index(capsys, store, "build", "--kind", "flat")[0] == 0
    ids = next(Path(store.uri(), "g", "_index", "v1").glob("*/ids.parquet"))
    ids.write_bytes(ids.read_bytes()[:-9] + b"corrupted")  # same size, other bytes
    before = files(store.uri())
    code, out, err = search(capsys, store, "r5")
    assert code == 0 and json.loads(out)["results"][0]["ids"][0] == "r5"
    assert "its index is unusable" in err and "expected sha256" in err
    assert files(store.uri()) == before


def test_index_build_publishes_the_index_search_then_uses(store, capsys):
    code, out, _ = index(capsys, store, "build")
    assert code == 0 and out.startswith("indexed g/v1: flat over 400 rows, recall@10 1.0000 ")
    assert "against exact search on 400 sampled rows, at " in out  # 1000 capped at the rows
    code, out, err = search(capsys, store, "r9")
    assert code == 0 and json.loads(out)["results"][0]["ids"][0] == "r9"
    assert "exactly" not in err


def test_index_build_refuses_a_lower_recall_without_force(store, capsys):
    """Issue 40, item 9: a lossy IVF-PQ does not silently replace an exact index."""
    assert index(capsys, store, "build", "--kind", "flat")[0] == 0
    before = files(store.uri())
    lossy = ("--kind", "ivfpq", "--nlist", "16", "--nprobe", "1", "--queries", "100")
    code, out, err = index(capsys, store, "build", *lossy)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "g/v1: the new ivfpq index measures recall@10 0." in err
    assert "below the published flat index's 1.0000 (on 100 sampled rows)" in err
    assert "nothing replaced, rerun with --force" in err and files(store.uri()) == before
    code, out, _ = index(capsys, store, "build", *lossy, "--force", "--json")
    report = json.loads(out)
    assert code == 0 and report["kind"] == "ivfpq" and report["replaced_recall"] == 1.0
    assert report["recall"] < 0.9 and (report["k"], report["queries"]) == (10, 100)


def test_index_verify_reports_checksums_and_recall(store, capsys):
    assert index(capsys, store, "build", "--kind", "flat")[0] == 0
    code, out, _ = index(capsys, store, "verify", "--queries", "50", "--json")
    report = json.loads(out)
    assert code == 0 and report["checksums"] == "ok" and report["kind"] == "flat"
    assert (report["recall"], report["k"], report["queries"]) == (1.0, 10, 50)
    code, out, _ = index(capsys, store, "verify")
    assert code == 0 and "checksums ok; recall@10 1.0000 against exact search on 100" in out


def test_index_verify_measures_an_approximate_index_below_one(store, capsys):
    """An IVF-PQ visiting 1 of 16 lists misses true neighbours: the estimate shows it."""
    argv = ("--kind", "ivfpq", "--nlist", "16", "--nprobe", "1")
    assert index(capsys, store, "build", *argv)[0] == 0
    code, out, _ = index(capsys, store, "verify", "--json")
    report = json.loads(out)
    assert code == 0 and report["kind"] == "ivfpq" and 0.1 < report["recall"] < 0.9


def test_index_verify_fails_on_a_missing_or_corrupt_index(store, capsys):
    code, _, err = index(capsys, store, "verify")
    assert code == 1 and "no index for g/v1; build it: raycompat index build g" in err
    assert len(err.strip().splitlines()) == 1
    assert index(capsys, store, "build")[0] == 0
    faiss_file = next(Path(store.uri(), "g", "_index", "v1").glob("*/index.faiss"))
    faiss_file.write_bytes(faiss_file.read_bytes()[:-4])
    code, _, err = index(capsys, store, "verify")
    assert code == 1 and f"{faiss_file}: expected" in err and "bytes, found" in err


def test_index_commands_name_unknown_galleries_and_versions(store, capsys):
    code, _, err = cli(capsys, "index", "build", "gg", "--version", "v1", "--store", store.uri())
    assert code == 1 and "galleries are g" in err
    code, _, err = index(capsys, store, "verify", "--version", "v9")
    assert code == 1 and "v1" in err


def test_index_options_the_version_cannot_train_are_one_line_usage_errors(store, capsys):
    """400 rows cannot train 512 inverted lists: the builder's message, one line, exit 2, and
    nothing published."""
    code, _, err = index(capsys, store, "build", "--kind", "ivfpq", "--nlist", "512")
    assert code == 2 and "g/v1: ivfpq with nlist=512" in err and "training vectors" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not list(Path(store.uri(), "g").glob("_index/v1/*/index.faiss"))


def copy_until_full(source, destination, **kwargs):
    """``pyarrow.fs.copy_files`` onto a full disk: a part of the file, then pyarrow's ENOSPC."""
    with open(destination, "wb") as handle:
        handle.write(b"partial")
    raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left")


def index_file_until_full(self, path):
    """``SearchIndex.save`` onto a full temporary disk: faiss's RuntimeError, which has no errno."""
    Path(path).write_bytes(b"partial")
    failed = f"write error in {path}: 3 != 64 (No space left on device)"
    raise RuntimeError(f"Error: 'ret == (n)' failed: {failed}")


@pytest.mark.parametrize("where", ["store", "temporary folder"])
def test_a_full_disk_is_one_line_and_leaves_no_partial_build(store, capsys, monkeypatch, where):
    """``index build`` on a full disk: one line saying so and naming where, exit 1; the build's
    partial files are removed, the published index (named by the pointer) is kept."""
    import pyarrow.fs as pafs

    from raycompat.index.search_index import SearchIndex

    assert index(capsys, store, "build", "--kind", "flat")[0] == 0
    before = files(store.root)
    if where == "store":
        monkeypatch.setattr(pafs, "copy_files", copy_until_full)
    else:
        monkeypatch.setattr(SearchIndex, "save", index_file_until_full)
    code, out, err = index(capsys, store, "build", "--kind", "flat", "--force")
    assert (code, out) == (1, "")
    (line,) = err.splitlines()
    assert "no space left on device" in line and "credentials" not in line, line
    if where == "store":
        build = line.split("/_index/v1/")[1].split("/")[0]
        assert line == (
            f"raycompat: error: {store.uri('g', '_index', 'v1', build, 'index.faiss')}: no "
            "space left on device; the index was not published and this build's partial files "
            "were removed"
        )
    else:
        assert "the index is staged in the temporary folder" in line and "TMPDIR" in line
    assert files(store.root) == before  # no orphan index.faiss; the published build kept
    monkeypatch.undo()  # the disk has space again
    code, _, err = search(capsys, store, "r1")
    assert code == 0 and "exactly" not in err  # the published index answers
