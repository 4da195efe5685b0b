"""``raycompat serve``: the service in its own process, bound to 127.0.0.1 by default, the
token read from a file and never printed, stopped by SIGINT with one line (issue 42, items 2
and 6); as an orchestrator sees it (item 5): SIGTERM drains and exits 0, a port in use or out
of range fails before anything loads, each request is logged unless ``--no-access-log``, and
``search --json`` gives ids of the type the service gives."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from raycompat.cli.app import main, parser
from raycompat.service import Served, create_app, running
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from tests.serving import test_served_log
from tests.serving.test_served_log import served_copy

served_template = test_served_log.served_template  # the session's template store, a fixture

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "cli-t0ken-never-printed"


@pytest.fixture
def store(served_template, tmp_path) -> GalleryStore:
    """Gallery g of tests/serving/test_served_log.py: m1, m2 and m3 query v1."""
    return GalleryStore(served_copy(served_template, tmp_path))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, headers: dict) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/healthz", headers=headers).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"the service did not start: {proc.communicate(timeout=5)}")


def start(store: GalleryStore, *options: str) -> tuple[subprocess.Popen, int]:
    """``raycompat serve`` on a free loopback port, in its own process."""
    port = free_port()
    command = [sys.executable, "-m", "raycompat.cli.app", "serve", "--store", store.uri()]
    command += ["--port", str(port), *options]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, port


def stop(proc: subprocess.Popen, sig: int) -> tuple[str, str]:
    """Send ``sig`` (unless it has exited) and wait, at most 30 s; its stdout and stderr."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
    return out.decode(), err.decode()


def test_serve_binds_loopback_asks_the_token_and_stops_on_sigint(store, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    proc, port = start(store, "--token-file", str(token_file), "--no-access-log")
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {TOKEN}"}
    try:
        wait_up(url, proc, auth)
        bound = {c.laddr.ip for c in psutil.Process(proc.pid).net_connections("tcp") if c.laddr}
        assert bound == {"127.0.0.1"}
        body = {"gallery": "g", "model": "m1", "ids": ["v1-3"], "k": 1}
        assert httpx.post(f"{url}/v1/search", json=body).status_code == 401
        answer = httpx.post(f"{url}/v1/search", json=body, headers=auth).json()
        assert answer["version"] == "v1" and answer["hits"][0][0]["id"] == "v1-3"
    finally:
        out, err = stop(proc, signal.SIGINT)
    assert proc.returncode == 0 and out.startswith("stopped serving ")
    assert TOKEN not in out + err and "swap g/m1" in err
    assert "raycompat.service.access" not in err  # --no-access-log


def test_sigterm_lets_the_request_in_flight_finish_and_exits_0(store):
    proc, port = start(store)
    body = json.dumps({"gallery": "g", "model": "m1", "ids": ["v1-3"], "k": 1}).encode()
    head = (
        f"POST /v1/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    answer, draining = b"", None
    try:
        wait_up(f"http://127.0.0.1:{port}", proc, {})
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head + body[:10])  # in flight: its body is not all sent yet
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            draining = proc.poll() is None  # still waiting for the request, not gone
            sock.sendall(body[10:])
            while chunk := sock.recv(65536):  # the server closes the connection after it
                answer += chunk
    finally:
        out, err = stop(proc, signal.SIGTERM)
    assert draining and answer.startswith(b"HTTP/1.1 200 ") and b'"id":"v1-3"' in answer
    assert proc.returncode == 0 and out.startswith(f"stopped serving {store.uri()} on "), err
    assert f"listening on http://127.0.0.1:{port} " in err  # the port it listens on
    access = [line for line in err.splitlines() if line.startswith("raycompat.service.access")]
    assert len(access) == 2 and " GET /healthz 200 " in access[0]  # wait_up's probe
    assert " POST /v1/search 200 " in access[1] and access[1].endswith(" ms g/m1 v1")


def test_a_port_in_use_is_one_line_exit_1_before_any_index_loads(store, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--store", store.uri(), "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"raycompat: error: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in err and "--port" in err and "swap" not in err  # nothing was loaded


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_a_port_outside_1_to_65535_is_a_usage_error(port, capsys):
    with pytest.raises(SystemExit) as stopped:
        parser().parse_args(["serve", "--store", "s", "--port", port])
    last = capsys.readouterr().err.splitlines()[-1]
    assert stopped.value.code == 2 and last.startswith("raycompat serve: error: argument --port: ")
    assert "65535" in last or "not a port number" in last


def test_search_json_gives_integer_ids_as_the_service_does(tmp_path, capsys):
    store = GalleryStore(str(tmp_path / "store"))
    staging = store.begin("s", VersionInfo("v1", "m1", 2, False, "v1 = x"))
    rows = np.array([[0, 0], [0.1, 0], [5, 5]], np.float32)
    staging.write_table(embedding_table(np.arange(3), rows), "p.parquet")
    staging.commit(expected_rows=3)
    Catalog(store).register_model(ModelRecord("m1", "", 2, "independent"))
    Catalog(store).grant(QueryGrant("s", "v1", "m1", "extracted"))
    argv = ["search", "s", "--ids", "0", "--model", "m1", "-k", "2", "--store", store.root]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["results"][0]["ids"]
    with running(create_app(Served(store))) as url:
        body = {"gallery": "s", "model": "m1", "ids": [0], "k": 2}
        answered = httpx.post(f"{url}/v1/search", json=body, timeout=10).json()["hits"][0]
    assert printed == [h["id"] for h in answered] == [0, 1]


def test_an_unreadable_token_file_is_one_line_exit_2(store, tmp_path, capsys):
    code = main(["serve", "--store", store.uri(), "--token-file", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--token-file" in err and "unreadable" in err
