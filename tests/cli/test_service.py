"""``raycompat serve``: the service in its own process, bound to 127.0.0.1 by default, the
token read from a file and never printed, stopped by SIGINT with one line (issue 42, items 2
and 6)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from raycompat.cli.app import main
from raycompat.store import GalleryStore
from tests.store import test_aliases
from tests.store.test_aliases import served_copy

served_template = test_aliases.served_template  # the session's template store, a fixture

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "cli-t0ken-never-printed"


@pytest.fixture
def store(served_template, tmp_path) -> GalleryStore:
    """Gallery g of tests/store/test_aliases.py: m1, m2 and m3 query v1."""
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


def test_serve_binds_loopback_asks_the_token_and_stops_on_sigint(store, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    port = free_port()
    command = [sys.executable, "-m", "raycompat.cli.app", "serve", "--store", store.uri()]
    command += ["--port", str(port), "--token-file", str(token_file)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.decode().startswith("stopped serving ")
    assert TOKEN not in out.decode() + err.decode() and "swap g/m1" in err.decode()


def test_an_unreadable_token_file_is_one_line_exit_2(store, tmp_path, capsys):
    code = main(["serve", "--store", store.uri(), "--token-file", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--token-file" in err and "unreadable" in err
