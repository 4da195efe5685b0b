"""Run the app under uvicorn: in the foreground (``raycompat serve``) or in a background thread
on a free loopback port (:func:`running`: the tests and ``benchmarks/serve_bench.py`` talk to
it over real HTTP)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn

STARTUP_S = 120  # loading every pair's index happens before the port answers


def serve_forever(app, host: str, port: int, log_level: str = "info") -> None:
    """Serve ``app`` on ``host:port`` until interrupted (Ctrl-C, SIGTERM)."""
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


@contextlib.contextmanager
def running(app, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` in a thread while the block runs; yields its base URL
    (``http://127.0.0.1:<port>``); stops it (and its watcher) on leaving."""
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    )
    server.install_signal_handlers = lambda: None  # only the main thread may
    thread = threading.Thread(target=server.run, name="raycompat-service", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the service on {host} did not start")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
