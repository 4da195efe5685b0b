"""Reading a float16 version to float32 against reading the same rows stored as float32.

    .venv/bin/python benchmarks/float16_read.py --out benchmarks/results/float16_read_cpu.json

The same ``--rows`` x ``--width`` unit rows are published twice in a local store, as a float32
and as a float16 version (half the bytes). A read is what index builds and ``raycompat search``
do: ``GalleryStore.iter_batches(columns=["embedding"])`` (Parquet decode and the store's value
checks) and ``raycompat.store.read.vectors.vectors`` of each batch (float16 widened to float32).
Both files are read once before timing (page cache). Reported, each the median of ``--pairs``
interleaved pairs:

- ``read``: float16 read over float32 read (the target: at most 1.1x); ``read_with_numpy_cast``:
  the float16 read as it was before issue 24 (NumPy's cast in the value checks and in
  ``vectors``; emulated by swapping those two functions in), over the same float32 read;
- ``widen``: the float16 -> float32 conversion alone over all rows, ``widen_float16`` (NumPy's
  cast since issue 39) against faiss's fp16 decoder (what it was from issue 24 to issue 39), and
  against a float32 copy (what ``vectors`` does for a float32 version);
- ``parts``: seconds of each step for each dtype (decode only, + value checks, + widening), so
  that what remains of the float16 cost is named.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gallery import GALLERY, load, paired, publish_mixture  # noqa: E402
from _machine import emit, machine_info, store_parser, store_root  # noqa: E402

from raycompat.store import GalleryStore, schema  # noqa: E402
from raycompat.store.read.vectors import vectors, widen_float16  # noqa: E402

VERSIONS = {"float32": "v32", "float16": "v16"}


def read(store: GalleryStore, version: str, batch_size: int, to_float32=vectors):
    def run():
        for batch in store.iter_batches(GALLERY, version, batch_size, columns=["embedding"]):
            to_float32(batch, "embedding")

    return run


def numpy_cast(batch, name: str) -> np.ndarray:
    """``vectors`` as it was before issue 24: NumPy's element-wise float16 cast."""
    column = batch.column(name)
    flat = column.flatten().to_numpy(zero_copy_only=False)
    return np.array(flat, dtype=np.float32).reshape(len(column), column.type.list_size)


def numpy_rows(column, *, copy: bool = True) -> np.ndarray:
    """The value checks' widening as it was before issue 24 (``schema._check_vectors``)."""
    x = column.flatten().to_numpy().astype(np.float32, copy=False)
    return x.reshape(len(column), column.type.list_size)


@contextmanager
def widened_by_numpy():
    """The store's value checks widen float16 with NumPy, as before issue 24."""
    saved, schema.float32_rows = schema.float32_rows, numpy_rows
    try:
        yield
    finally:
        schema.float32_rows = saved


def before(store: GalleryStore, version: str, batch_size: int):
    run = read(store, version, batch_size, numpy_cast)

    def with_numpy_checks():
        with widened_by_numpy():
            run()

    return with_numpy_checks


def decode_only(store: GalleryStore, version: str, batch_size: int):
    """Parquet decode of the embedding column, no checks, no conversion."""
    info = store.version(GALLERY, version)
    files = [str(Path(store.root, GALLERY, f)) for f in info.files]

    def run():
        for path in files:
            for _ in pq.ParquetFile(path).iter_batches(batch_size, columns=["embedding"]):
                pass

    return run


def checked_only(store: GalleryStore, version: str, batch_size: int):
    def run():
        for _ in store.iter_batches(GALLERY, version, batch_size, columns=["embedding"]):
            pass

    return run


def faiss_fp16(half: np.ndarray) -> np.ndarray:
    """``widen_float16`` from issue 24 to issue 39: faiss's SIMD fp16 scalar-quantizer decoder."""
    import faiss

    quantizer = faiss.ScalarQuantizer(half.shape[1], faiss.ScalarQuantizer.QT_fp16)
    return quantizer.decode(np.ascontiguousarray(half).view(np.uint8))


def widen(args, store: GalleryStore) -> dict:
    table = pq.read_table(Path(store.root, GALLERY, store.version(GALLERY, "v16").files[0]))
    half = table.column("embedding").combine_chunks().flatten().to_numpy()
    half = half.reshape(-1, args.width)
    wide = half.astype(np.float32)
    return {
        "values": int(half.size),
        "numpy_over_faiss_fp16": paired(
            lambda: widen_float16(half), lambda: faiss_fp16(half), args.pairs
        ),
        "numpy_over_float32_copy": paired(
            lambda: widen_float16(half), lambda: np.array(wide), args.pairs
        ),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = store_parser(__doc__, rows=1_000_000, width=128)
    parser.add_argument("--batch-size", type=int, default=65536)
    args = parser.parse_args(argv)
    root, temporary = store_root(args.store)
    for dtype, version in VERSIONS.items():
        publish_mixture(root, version, args.rows, args.width, dtype=dtype)
    store = GalleryStore(root)
    result = {"benchmark": "float16_read", "machine": machine_info(), "args": vars(args)}
    result["load_start"] = load()
    half, full = (read(store, VERSIONS[d], args.batch_size) for d in ("float16", "float32"))
    half(), full()  # page cache
    result["read"] = paired(half, full, args.pairs)
    old = before(store, VERSIONS["float16"], args.batch_size)
    result["read_with_numpy_cast"] = paired(old, full, args.pairs)
    result["widen"] = widen(args, store)
    result["parts"] = {}
    for dtype, version in VERSIONS.items():
        steps = {
            "decode": decode_only(store, version, args.batch_size),
            "decode_check": checked_only(store, version, args.batch_size),
            "decode_check_vectors": read(store, version, args.batch_size),
        }
        result["parts"][dtype] = {name: paired(fn, fn, 3)["ours_s"] for name, fn in steps.items()}
    result["load_end"] = load()
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
