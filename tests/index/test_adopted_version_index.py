"""The index of an adopted version (issue 22): a table large enough for the sharded IVF is read
where it lies (the version's ``external`` root), not looked for inside the store."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raycompat.cli.app import main as cli
from raycompat.index.ivf import SHARDED_IVF
from raycompat.index.version_index import build_version_index, load_version_index
from raycompat.store import GalleryStore
from raycompat.store.formats.adopt import plan_adoption, publish_adopted, summarize
from raycompat.store.formats.adopt_scan import scan_file

FILES, ROWS, WIDTH = 4, 500, 8  # 2000 rows: sharded above flat_max_rows=1000, nlist 32


pytestmark = pytest.mark.usefixtures("one_faiss_thread")


def adopted(tmp_path) -> tuple[GalleryStore, np.ndarray]:
    """4 Parquet files outside the store (ids ``image_id``, vectors ``vec``) adopted as
    ``faces/v1`` by model ``ext``; the scans run here (``adopt_scan``), not on Ray."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(FILES * ROWS, WIDTH)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    (tmp_path / "table").mkdir()
    for f in range(FILES):
        rows = slice(f * ROWS, (f + 1) * ROWS)
        vec = pa.FixedSizeListArray.from_arrays(pa.array(x[rows].ravel()), WIDTH)
        ids = pa.array([f"face-{r}" for r in range(rows.start, rows.stop)])
        pq.write_table(pa.table({"image_id": ids, "vec": vec}), tmp_path / f"table/p{f}.parquet")
    store = GalleryStore(str(tmp_path / "store"))
    plan = plan_adoption(
        store,
        "faces",
        "v1",
        str(tmp_path / "table"),
        model="ext",
        id_column="image_id",
        embedding_column="vec",
    )
    reports = [scan_file(store, plan, rel) for rel in plan.files]
    publish_adopted(store, plan, summarize(plan, reports))
    return store, x


def test_an_adopted_table_is_indexed_in_shards_and_searched(tmp_path, capsys):
    store, x = adopted(tmp_path)
    assert not list((tmp_path / "store" / "faces").glob("*.parquet"))  # no copy in the store
    build_version_index(
        store, "faces", "v1", flat_max_rows=1000, rows_per_shard=ROWS * 2, use_gpu=False
    )  # kind="auto"
    pointer = json.loads((tmp_path / "store/faces/_index/v1.json").read_text())
    assert pointer["kind"] == SHARDED_IVF and pointer["shards"] == 2
    index = load_version_index(store, "faces", "v1", use_gpu=False)
    queries = x[[7, 1234, 1999]]
    scores, found = index.search(queries, 5, nprobe=pointer["nlist"])  # every list: exact
    truth = np.argsort(-(queries @ x.T), axis=1, kind="stable")[:, :5]
    assert found.tolist() == [[f"face-{r}" for r in row] for row in truth]
    np.save(tmp_path / "q.npy", queries)
    argv = [
        "search",
        "faces",
        "--vectors",
        str(tmp_path / "q.npy"),
        "--store",
        store.uri(),
        "--model",
        "ext",
        "--json",
    ]
    assert cli(argv) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [r["ids"][0] for r in results] == ["face-7", "face-1234", "face-1999"]
