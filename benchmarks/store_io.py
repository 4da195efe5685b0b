"""Store bulk I/O: s3fs vs pyarrow's native S3 client against a local moto server, and local disk.

    .venv/bin/python benchmarks/store_io.py --out benchmarks/results/store_io_cpu.json

Part 1 (``raw``): ``pq.write_table`` / ``pq.read_table`` of an ``--rows`` x ``--dim`` table
(string ids + ``fixed_size_list<float32>`` embeddings, page checksums on, as the store writes),
as ``--files`` part files, through each pyarrow filesystem the store can use for bulk I/O:
``s3fs`` (``PyFileSystem(FSSpecHandler(s3fs))``), ``pyarrow_native``
(``pyarrow.fs.S3FileSystem(endpoint_override=...)``) and ``local`` disk as the physical bound.
Part 2 (``store``): the store's own path, ``Staging.write_table`` + ``commit`` (which re-reads
and validates every row) + ``read``, with ``bulk_io="fsspec"`` and ``"native"``. Times are
medians of ``--repeats`` runs.

Several part files, not one: moto 5.2.5 fails to complete the native client's multipart upload
of a single ~600 MB object (a server-side "seek of closed file" in moto); 150 MB objects work.

moto is an in-process Python emulator of S3, on this machine's cores: absolute S3 rates are far
below real S3 and the s3fs/native ratio is indicative only.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.io.uri import native_s3_options  # noqa: E402
from raycompat.store import GalleryStore, VersionInfo, embedding_table  # noqa: E402

FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


def start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            return proc, endpoint
        except urllib.error.HTTPError:
            return proc, endpoint
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"moto server on {endpoint} did not start")


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rates(rows: int, nbytes: int, seconds: float) -> dict:
    return {"median_s": seconds, "rows_per_s": rows / seconds, "mb_per_s": nbytes / 1e6 / seconds}


def slices(table: pa.Table, files: int) -> list[pa.Table]:
    step = -(-table.num_rows // files)
    return [table.slice(s, step) for s in range(0, table.num_rows, step)]


def raw_io(table: pa.Table, fs: pafs.FileSystem, prefix: str, files: int, repeats: int) -> dict:
    parts = {f"{prefix}/part-{i:05d}.parquet": t for i, t in enumerate(slices(table, files))}
    if fs.type_name == "local":
        fs.create_dir(prefix)

    def write() -> None:
        for path, part in parts.items():
            pq.write_table(part, path, filesystem=fs, write_page_checksum=True)

    def read() -> int:
        return sum(pq.read_table(path, filesystem=fs).num_rows for path in parts)

    write_s = median_time(write, repeats)
    size = sum(fs.get_file_info(path).size for path in parts)
    read_s = median_time(read, repeats)
    assert read() == table.num_rows
    fs.delete_dir(prefix)
    return {
        "files_mb": size / 1e6,
        "write": rates(table.num_rows, size, write_s),
        "read": rates(table.num_rows, size, read_s),
    }


def store_io(table: pa.Table, store: GalleryStore, files: int, repeats: int) -> dict:
    publish, read = [], []
    dim = table.schema.field("embedding").type.list_size
    for r in range(repeats):
        info = VersionInfo(f"v{r}", "bench-model", dim, True, f"v{r} = extract(bench-model)")
        start = time.perf_counter()
        staging = store.begin("bench", info, "run")
        for i, part in enumerate(slices(table, files)):
            staging.write_table(part, f"part-{i:05d}.parquet")
        staging.commit(expected_rows=table.num_rows)
        publish.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert store.read("bench", info.version).num_rows == table.num_rows
        read.append(time.perf_counter() - start)
        store.filesystem.delete_dir(store.path("bench"))  # keep moto's memory bounded
    nbytes = table.nbytes
    return {
        "publish_write_and_verify": rates(table.num_rows, nbytes, statistics.median(publish)),
        "read_validated": rates(table.num_rows, nbytes, statistics.median(read)),
        "mb_is": "in-memory Arrow bytes",
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--files", type=int, default=4, help="part files the table is written as")
    p.add_argument("--skip-store", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    os.environ.update(FAKE_AWS_ENV)
    import fsspec

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    table = embedding_table([f"img-{i:09d}" for i in range(args.rows)], x)
    proc, endpoint = start_moto()
    try:
        options = {"client_kwargs": {"endpoint_url": endpoint}}
        s3 = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        s3.mkdir("store-bench")
        filesystems = {
            "s3fs": pafs.PyFileSystem(pafs.FSSpecHandler(s3)),
            "pyarrow_native": pafs.S3FileSystem(**native_s3_options(options)),
        }
        result = {
            "machine": {**machine_info(), "loadavg_start": os.getloadavg()},
            "table": {
                "rows": args.rows,
                "dim": args.dim,
                "arrow_mb": table.nbytes / 1e6,
                "id": "string",
                "files": args.files,
            },
            "repeats": args.repeats,
            "raw": {},
            "store": {},
        }
        for name, fs in filesystems.items():
            result["raw"][name] = raw_io(
                table, fs, f"store-bench/raw-{name}", args.files, args.repeats
            )
        with tempfile.TemporaryDirectory() as tmp:
            result["raw"]["local"] = raw_io(
                table, pafs.LocalFileSystem(), f"{tmp}/raw", args.files, args.repeats
            )
        if not args.skip_store:
            for bulk_io in ("fsspec", "native"):
                store = GalleryStore(f"s3://store-bench/{bulk_io}", options, bulk_io=bulk_io)
                result["store"][bulk_io] = store_io(table, store, args.files, args.repeats)
    finally:
        proc.terminate()
        proc.wait()
        default_fs = type(GalleryStore("s3://store-bench/x", options).filesystem).__name__
    raw = result["raw"]
    result["native_over_s3fs"] = {
        op: raw["s3fs"][op]["median_s"] / raw["pyarrow_native"][op]["median_s"]
        for op in ("write", "read")
    }
    # What GalleryStore picks for these options with its default bulk_io="auto".
    result["store_bulk_io_default"] = default_fs
    result["machine"]["loadavg_end"] = os.getloadavg()
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
