"""The search service over real HTTP against faiss searching the same index in process, and a
run that swaps versions every second under load (issue 42, item 7).

    .venv/bin/python benchmarks/serve_bench.py --out benchmarks/results/serve_cpu.json

A local store holds gallery ``bench``: ``v1`` and ``v2`` of model m1, ``--rows`` x ``--width``
unit rows each (cosine), each with a published flat index; v1's ids are ``0..rows-1`` and v2's
``OFFSET + 0..rows-1``, so every hit says which version it came from. ``raycompat serve`` runs
in its own process (as in production: the client does not share its interpreter) and this
process talks to it with one keep-alive ``httpx.Client`` per thread over loopback.

- ``single`` / ``batch``: ``--singles`` requests of one query, ``--batches`` of ``--batch``
  queries, one at a time: QPS (queries per second), p50 and p99 per request; ``faiss``: the
  same queries through the same faiss index file, loaded in this process (normalised, then
  ``index.search``): the ceiling; ``ratio``: service p50 over faiss p50. Both run faiss on
  ``--faiss-threads`` OpenMP threads (default 1).
- ``swaps``: ``--clients`` threads search for ``--swap-s`` seconds while this process changes
  m1's serving records every ``--swap-every`` seconds, cycling promote v2, rollback (v1),
  revoke, rollback (v1). Each answer's ``version`` is checked against the records' timeline
  (:func:`allowed`: what was served when the request was sent, or any change written while
  it ran), every hit's id against that version (a mixed answer), and a 404 is allowed only
  when a revoke stood during the request. ``failed``: any other status or a transport error.
  ``--poll-only``: the service follows by its 1 s poll only, so its answers lag the changes:
  the control that shows the judge catches them. ``--via alias``: the searches name the named
  alias ``prod`` (set to (v1, m1) before the service starts) instead of the model, and the
  cycle moves the alias: set prod to (v2, m1), roll prod back (v1), revoke m1 (the alias stops
  too: 404), roll m1 back (prod serves v1 again).
"""

from __future__ import annotations

import argparse
import bisect
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info, store_root  # noqa: E402

GALLERY, MODEL, ALIAS, OFFSET, K = "bench", "m1", "prod", 10_000_000, 10
REVOKED = None


@dataclass(frozen=True)
class Change:
    """A change of the serving records: written between ``start`` and ``end`` (monotonic s),
    after which the model serves ``version`` (None: revoked)."""

    start: float
    end: float
    version: str | None


def allowed(changes: list[Change], initial: str | None, sent: float, got: float) -> set:
    """The versions an answer to a request sent at ``sent`` and answered at ``got`` may name:
    what the records served at ``sent`` (changes finished before it), and what any change
    written while the request ran serves."""
    ends = [c.end for c in changes]
    before = bisect.bisect_left(ends, sent)
    served = {changes[before - 1].version if before else initial}
    return served | {c.version for c in changes if c.start <= got and c.end >= sent}


def answer_problem(answer: dict, status: int, ok: set) -> str | None:
    """What is wrong with one answer given the versions it may name, or None."""
    if status == 404:
        return None if REVOKED in ok else "404 while the model was served"
    if status != 200:
        return f"status {status}"
    version = answer["version"]
    if version not in ok:
        return f"version {version}, the records served {sorted(map(str, ok))}"
    low = 0 if version == "v1" else OFFSET
    ids = [h["id"] for row in answer["hits"] for h in row]
    if not all(low <= i < low + OFFSET for i in ids):
        return f"a mixed answer: ids of another version than {version}"
    return None


def publish(root: str, rows: int, width: int) -> None:
    """Gallery ``bench``: v1 and v2 of m1 (unit rows, ids apart), each flat-indexed; m1 is
    granted v1 (and may serve v2, its own)."""
    from raycompat.index.version_index import build_version_index
    from raycompat.store import GalleryStore, VersionInfo, embedding_table
    from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant

    store = GalleryStore(root)
    for n, version in enumerate(("v1", "v2")):
        x = np.random.default_rng(n).normal(size=(rows, width)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        staging = store.begin(GALLERY, VersionInfo(version, MODEL, width, True, f"{version} = x"))
        staging.write_table(embedding_table(np.arange(rows) + n * OFFSET, x), "p.parquet")
        staging.commit(expected_rows=rows)
        build_version_index(store, GALLERY, version, kind="flat", use_gpu=False)
    catalog = Catalog(store)
    catalog.register_model(ModelRecord(MODEL, "", width, "independent"))
    catalog.grant(QueryGrant(GALLERY, "v1", MODEL, "extracted"))


def start_service(
    root: str, port: int, poll_only: bool = False, threads: int = 1
) -> subprocess.Popen:
    """``raycompat serve`` on ``port`` in its own process, once its /healthz answers."""
    import httpx

    command = [sys.executable, "-m", "raycompat.cli.app", "serve", "--store", root]
    command += ["--port", str(port), "--max-batch", "1000"] + ["--poll-only"] * poll_only
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env["OMP_NUM_THREADS"] = str(threads)  # faiss's threads, as the baseline's
    service = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return service
        except httpx.TransportError:
            time.sleep(0.1)
    service.kill()
    raise RuntimeError("the service did not start")


def percentiles(seconds: list[float], queries: int | None = None) -> dict:
    """p50 and p99 of ``seconds`` (in ms); with ``queries`` per request, the QPS of requests
    sent one after another."""
    ms = np.asarray(seconds) * 1000
    out = {"requests": len(ms)}
    if queries is not None:
        out["qps"] = round(queries * len(ms) / (ms.sum() / 1000), 1)
    out["p50_ms"] = round(float(np.percentile(ms, 50)), 3)
    out["p99_ms"] = round(float(np.percentile(ms, 99)), 3)
    out["max_ms"] = round(float(ms.max()), 3)
    return out


def http_times(url: str, queries: np.ndarray, batch: int) -> list[float]:
    import httpx

    times = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for start in range(0, len(queries) - batch + 1, batch):
            body = {"gallery": GALLERY, "model": MODEL, "k": K}
            body["vectors"] = queries[start : start + batch].tolist()
            sent = time.perf_counter()
            got = client.post("/v1/search", json=body)
            times.append(time.perf_counter() - sent)
            assert got.status_code == 200, got.text
    return times


def faiss_times(root: str, queries: np.ndarray, batch: int) -> list[float]:
    """The same queries through the same index file, faiss in this process (the ceiling)."""
    import faiss

    from raycompat.index.version_index import load_version_index
    from raycompat.store import GalleryStore

    index = load_version_index(GalleryStore(root), GALLERY, "v1", use_gpu=False).index.index
    times = []
    for start in range(0, len(queries) - batch + 1, batch):
        sent = time.perf_counter()
        q = np.array(queries[start : start + batch], dtype=np.float32)
        faiss.normalize_L2(q)
        index.search(q, K)
        times.append(time.perf_counter() - sent)
    return times


def throughput(root: str, url: str, args) -> dict:
    rng = np.random.default_rng(7)
    out = {}
    for name, batch, count in (("single", 1, args.singles), ("batch", args.batch, args.batches)):
        queries = rng.normal(size=(batch * count, args.width)).astype(np.float32)
        http_times(url, queries[: batch * 5], batch)  # warm the connection and the replica
        served = percentiles(http_times(url, queries, batch), batch)
        ceiling = percentiles(faiss_times(root, queries, batch), batch)
        ratio = round(served["p50_ms"] / ceiling["p50_ms"], 1)
        out[name] = {"batch": batch, "service": served, "faiss": ceiling, "p50_ratio": ratio}
    return out


CYCLES = {  # what the searches name -> the changes cycled (action, version served after it)
    "model": (("promote", "v2"), ("rollback", "v1"), ("revoke", REVOKED), ("rollback", "v1")),
    "alias": (("set", "v2"), ("alias rollback", "v1"), ("revoke", REVOKED), ("rollback", "v1")),
}


def change_records(
    root: str, every_s: float, stop: threading.Event, changes: list, via: str = "model"
) -> None:
    """Cycle the serving records through ``CYCLES[via]``, one change every ``every_s``."""
    from raycompat.serving import aliases
    from raycompat.serving.served_log import promote, revoke, rollback
    from raycompat.store import GalleryStore

    store, step, cycle = GalleryStore(root), 0, CYCLES[via]
    do = {
        "promote": lambda: promote(store, GALLERY, MODEL, "v2"),
        "rollback": lambda: rollback(store, GALLERY, MODEL),
        "revoke": lambda: revoke(store, GALLERY, MODEL),
        "set": lambda: aliases.set_alias(store, GALLERY, ALIAS, "v2", MODEL),
        "alias rollback": lambda: aliases.rollback(store, GALLERY, ALIAS),
    }
    while not stop.wait(every_s):
        action, version = cycle[step % len(cycle)]
        start = time.monotonic()
        do[action]()
        changes.append(Change(start, time.monotonic(), version))
        step += 1


def search_loop(
    url: str, width: int, seed: int, stop: threading.Event, out: list, via: str = "model"
) -> None:
    """Single-query searches of the model (or ``via`` the alias) one after another until
    ``stop``: ``(sent, got, status, answer)`` each (status -1: a transport error)."""
    import httpx

    rng = np.random.default_rng(seed)
    names = {"model": MODEL} if via == "model" else {"alias": ALIAS, "model": MODEL}
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            body = {"gallery": GALLERY, **names, "k": K}
            body["vectors"] = rng.normal(size=(1, width)).tolist()
            sent = time.monotonic()
            try:
                got = client.post("/v1/search", json=body)
                status, answer = got.status_code, got.json()
            except httpx.TransportError:
                status, answer = -1, None
            out.append((sent, time.monotonic(), status, answer))


def swap_run(root: str, url: str, args) -> dict:
    stop, changes, results = threading.Event(), [], []
    writer = (root, args.swap_every, stop, changes, args.via)
    threads = [threading.Thread(target=change_records, args=writer)]
    threads += [
        threading.Thread(target=search_loop, args=(url, args.width, seed, stop, results, args.via))
        for seed in range(args.clients)
    ]
    for thread in threads:
        thread.start()
    time.sleep(args.swap_s)
    stop.set()
    for thread in threads:
        thread.join()
    return judge(changes, results, "v1")


def judge(changes: list[Change], results: list, initial: str) -> dict:
    """Every answer checked against the records' timeline (see the module docstring)."""
    failed, wrong, mixed, examples = 0, 0, 0, []
    for sent, got, status, answer in results:
        if status not in (200, 404):
            failed += 1
            examples.append(f"status {status}: {answer}")
            continue
        problem = answer_problem(answer, status, allowed(changes, initial, sent, got))
        if problem:
            mixed += problem.startswith("a mixed")
            wrong += not problem.startswith("a mixed")
            examples.append(problem)
    span = max(got for _, got, _, _ in results) - min(sent for sent, _, _, _ in results)
    searched = [(sent, got) for sent, got, status, _ in results if status == 200]
    near = [  # searches that ran within 100 ms of a change being written
        got - sent
        for sent, got in searched
        if any(c.start - 0.1 <= got and sent <= c.end + 0.1 for c in changes)
    ]
    return {
        "changes": len(changes),
        "requests": len(results),
        "answered": sum(status == 200 for _, _, status, _ in results),
        "revoked_404": sum(status == 404 for _, _, status, _ in results),
        "failed": failed,
        "wrong_version": wrong,
        "mixed": mixed,
        "examples": examples[:5],
        "answered_qps": round(len(searched) / span, 1),
        "latency_of_answers": percentiles([got - sent for sent, got in searched]),
        "latency_of_answers_within_100ms_of_a_change": percentiles(near) if near else None,
    }


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--singles", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--swap-s", type=float, default=20.0)
    parser.add_argument("--swap-every", type=float, default=1.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--faiss-threads", type=int, default=1, help="OpenMP threads of faiss, in the service "
        "and the baseline alike (1: steady on shared cores, and what a replica answering "
        "concurrent requests wants)",
    )  # fmt: skip
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument(
        "--poll-only", action="store_true", help="the service follows by polling only (1 s)"
    )
    parser.add_argument(
        "--via", choices=sorted(CYCLES), default="model",
        help="the swap run's searches name the model, or the named alias prod",
    )  # fmt: skip
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import faiss

    load = os.getloadavg()[0]
    root, _keep = store_root(None)
    publish(root, args.rows, args.width)
    if args.via == "alias":
        from raycompat.serving import aliases
        from raycompat.store import GalleryStore

        aliases.set_alias(GalleryStore(root), GALLERY, ALIAS, "v1", MODEL)
    port = free_port()
    faiss.omp_set_num_threads(args.faiss_threads)
    service = start_service(root, port, args.poll_only, args.faiss_threads)
    url = f"http://127.0.0.1:{port}"
    try:
        speed = None if args.skip_throughput else throughput(root, url, args)
        swaps = swap_run(root, url, args)
    finally:
        service.terminate()
        service.wait(timeout=30)
    result = {"machine": machine_info(), "args": vars(args), "throughput": speed, "swaps": swaps}
    result["machine"]["loadavg_at_start_and_end"] = [load, os.getloadavg()[0]]  # shared cores
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
