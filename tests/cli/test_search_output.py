"""``raycompat search`` output (issue 22, item 5): stdout holds only the listing (faiss's C++
printing goes to stderr), only real hits are returned (faiss's padding dropped by its row label,
so an id -1 is a hit like any other), and bad -k or query files are one-line usage errors."""

from __future__ import annotations

import ctypes
import json

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raycompat.cli.app import main as cli
from raycompat.index.ivf import SHARDED_IVF
from raycompat.index.version_index import build_version_index, load_version_index
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

ROWS, WIDTH, PARTS = 2000, 8, 4  # sharded: nlist 32, about 62 rows per list
LIBC = ctypes.CDLL(None)


pytestmark = pytest.mark.usefixtures("one_faiss_thread")


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def served(root, rows: int, parts: int) -> tuple[GalleryStore, np.ndarray]:
    """A published cosine version ``g/v1`` of ``rows`` unit vectors whose int64 ids are
    ``row - 1`` (row 0 holds the real id -1), queried by model m1."""
    store, x = GalleryStore(str(root)), unit(np.random.default_rng(0).normal(size=(rows, WIDTH)))
    ids = np.arange(rows, dtype=np.int64) - 1
    staging = store.begin("g", VersionInfo("v1", "m1", WIDTH, True, "v1 = extract(m1)"))
    step = rows // parts
    for p in range(parts):
        part = slice(p * step, (p + 1) * step)
        staging.write_table(embedding_table(ids[part], x[part]), f"part-{p:05d}.parquet")
    staging.commit(expected_rows=rows)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord("m1", "unused", WIDTH, method="independent"))
    catalog.grant(QueryGrant("g", "v1", "m1", "extracted"))
    return store, x


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """``(store, x)`` with a ``sharded_ivf`` index (in-process build, 2 shards)."""
    store, x = served(tmp_path_factory.mktemp("sharded") / "store", ROWS, PARTS)
    faiss.omp_set_num_threads(1)
    build_version_index(store, "g", "v1", flat_max_rows=1000, rows_per_shard=1000, use_gpu=False)
    return store, x


@pytest.fixture
def flat(tmp_path):
    """``(store, x)``: 40 rows, searched with an exact flat index."""
    return served(tmp_path / "store", 40, 1)


def search(store, *argv) -> list[str]:
    return ["search", "g", *argv, "--store", store.uri(), "--model", "m1"]


def strict_json(text: str):
    """JSON as the standard defines it: ``Infinity``/``NaN`` are refused (Python accepts them)."""

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def run(capfd, argv: list[str]) -> tuple[int, str, str]:
    code = cli(argv)
    LIBC.fflush(None)  # what C code printed into its stdout buffer, as at process exit
    out, err = capfd.readouterr()
    return code, out, err


def test_json_on_a_sharded_index_is_only_json(sharded, tmp_path, capfd):
    store, x = sharded
    np.save(tmp_path / "q.npy", x[[5, 1500]])
    code, out, err = run(capfd, search(store, "--vectors", str(tmp_path / "q.npy"), "--json"))
    assert code == 0, err
    found = strict_json(out)  # faiss's IO_FLAG_ONDISK_SAME_DIR line used to lead stdout
    assert [r["ids"][0] for r in found["results"]] == [4, 1499]
    assert "IO_FLAG_ONDISK_SAME_DIR" in err


def test_padding_is_dropped_and_a_real_id_minus_one_is_a_hit(sharded, tmp_path, capfd):
    store, x = sharded
    np.save(tmp_path / "q.npy", x[[0, 1]])
    argv = search(store, "--vectors", str(tmp_path / "q.npy"), "-k", "1000", "--nprobe", "1")
    code, out, err = run(capfd, [*argv, "--json"])
    assert code == 0, err
    results = strict_json(out)["results"]
    for result, own in zip(results, [-1, 0], strict=True):
        assert result["ids"][0] == own  # row 0's id is -1: a real hit, ranked first
        assert 0 < len(result["ids"]) < 1000 and len(set(result["ids"])) == len(result["ids"])
        assert result["ids"].count(-1) <= 1 and None not in result["scores"]
        assert len(result["scores"]) == len(result["labels"]) == len(result["ids"])
    assert "2 of 2 queries got fewer than -k 1000 hits" in err and "--nprobe" in err
    index = load_version_index(store, "g", "v1", use_gpu=False)
    assert index.index.kind == SHARDED_IVF
    scores, ids = index.search(x[[0, 1]], 1000, nprobe=1)  # the padded (Q, k) arrays
    hits = index.hits(x[[0, 1]], 1000, nprobe=1)
    for (s, i), row_s, row_i, result in zip(hits, scores, ids, results, strict=True):
        n = int(np.isfinite(row_s).sum())
        assert len(i) == n and i.tolist() == row_i[:n].tolist() == result["ids"]
        np.testing.assert_array_equal(s, row_s[:n])


def test_k_above_a_flat_versions_rows_gives_every_row_with_a_note(flat, tmp_path, capfd):
    store, x = flat
    np.save(tmp_path / "q.npy", x[[3]])
    code, out, err = run(capfd, search(store, "--vectors", str(tmp_path / "q.npy"), "-k", "100"))
    assert code == 0, err
    assert "1 of 1 queries got fewer than -k 100 hits (fewest 40): version v1 holds 40 rows" in err
    assert len(out.splitlines()) == 4 + 40  # header, score line, column names, rule, the rows


QUERY_FILES = {
    "empty.npy": (np.zeros((0, WIDTH), np.float32), "no rows (shape (0, 8))"),
    "wide.npy": (np.ones((2, WIDTH + 1), np.float32), "shape (2, 9)"),
    "flat.npy": (np.ones(WIDTH, np.float32), "shape (8,)"),
    "nan.npy": (np.array([[1.0] * WIDTH, [np.nan] * WIDTH], np.float32), "NaN or inf in row 1"),
    "text.npy": (np.array([["a"] * WIDTH]), "values of type <U1"),
    "scalar.npy": (np.float32(1.0), "shape ()"),
    "garbage.npy": (b"not an array", "not a readable .npy array"),
    "empty.parquet": ("parquet", "no rows (shape (0, 8))"),
    "variable.parquet": ("variable", "no readable fixed-size list 'embedding'"),
    "absent.npy": (None, "not a readable .npy array"),
}


@pytest.mark.parametrize("name", sorted(QUERY_FILES))
def test_a_malformed_query_file_is_one_line_exit_2(flat, tmp_path, capfd, name):
    store, _ = flat
    content, problem = QUERY_FILES[name]
    path = tmp_path / name
    if isinstance(content, str):  # an empty table of fixed-size or variable-length vectors
        vec = pa.list_(pa.float32(), WIDTH if content == "parquet" else -1)
        pq.write_table(pa.table({"embedding": pa.array([], vec)}), path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        np.save(path, content)
    code, out, err = run(capfd, search(store, "--vectors", str(path), "--json"))
    assert (code, out) == (2, "")
    assert err.startswith(f"raycompat: error: {path}: ") and problem in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("k", ["0", "-3"])
def test_k_below_one_is_one_line_exit_2(flat, capfd, k):
    store, _ = flat
    code, out, err = run(capfd, search(store, "--ids", "3", "-k", k, "--json"))
    assert (code, out) == (2, "")
    assert err == f"raycompat: error: -k must be >= 1 (hits per query), got {k}\n"
