"""A SIGKILLed ``raycompat adopt`` leaves no Ray process behind (``raycompat/cluster/local_ray.py``;
issue 37: it left the raylet's dashboard and runtime-env agents running), and its console names
the private Ray it started instead of Ray's "Connecting to existing Ray cluster" (issue 52).

The command runs in a session of its own, so every process it starts, directly or through Ray
(the helper, GCS, raylet, agents, workers: none calls ``setsid``), is found by its session id
in ``/proc``. Its file scan is replaced by a Ray task that stalls (defined in the ``-c`` script,
so Ray ships it by value) and touches a file once a worker runs it: then the whole local
cluster is up, and the command is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from raycompat.store import embedding_table

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

ADOPT_WITH_A_STALLED_SCAN = """
import pathlib, sys, time
import ray
import raycompat.cluster.pipelines.adopt as pipeline
from raycompat.cli.app import main

SCANNING = sys.argv[1]

@ray.remote(num_cpus=1)
def stalled_scan(*args):
    pathlib.Path(SCANNING).touch()
    time.sleep(600)

pipeline._scan_files = stalled_scan
sys.exit(main(sys.argv[2:]))
"""


def session_processes(sid: int) -> dict[int, str]:
    """``pid -> command line`` of the live (not zombie) processes of session ``sid``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        state, _, _, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state not in "ZX":
            found[int(entry.name)] = command.strip()[:120]
    return found


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_killed_adopt_leaves_no_ray_process(tmp_path):
    table, scanning, log = tmp_path / "table", tmp_path / "scanning", tmp_path / "adopt.log"
    table.mkdir()
    pq.write_table(embedding_table(np.arange(8), np.ones((8, 4), np.float32)), table / "p.parquet")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray, then
    argv = f"adopt g {table} --store {tmp_path / 'store'} --version v1 --model m"
    with open(log, "wb") as output:
        adopt = subprocess.Popen(
            [sys.executable, "-c", ADOPT_WITH_A_STALLED_SCAN, str(scanning), *argv.split()],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        up = wait_for(lambda: scanning.exists() or adopt.poll() is not None, 90)
        assert up and adopt.poll() is None, log.read_text()[-3000:]
        # issue 52, items 4 and 7: one line names the private Ray it started, none of Ray's
        said = log.read_text()
        assert "Ray: a private local Ray that ends with this process: 1 node(s)" in said, said
        assert "Connecting to existing Ray cluster" not in said, said
        running = session_processes(adopt.pid)
        assert any("raylet" in c for c in running.values()), running
        assert any("ray::stalled_scan" in c for c in running.values()), running  # a worker

        adopt.kill()
        adopt.wait()
        assert wait_for(lambda: not session_processes(adopt.pid), 20), (
            f"left running 20 s after the SIGKILL: {session_processes(adopt.pid)}"
        )
    finally:
        if adopt.poll() is None:
            adopt.kill()
        for pid in session_processes(adopt.pid):  # only what this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
