"""Run the app under uvicorn: in the foreground (``raycompat serve``) or in a background thread
on a free loopback port (:func:`running`: the tests and ``benchmarks/serve_bench.py`` talk to
it over real HTTP).

The port is bound first (:func:`bind`), before the app loads a single index: a port in use is
one line and exit 1 at once, not uvicorn's ``[Errno 98]`` and exit 3 after every index was
loaded. It is listened on only once the app has started, so a connection is refused, not
left waiting, until every pair is loaded.

SIGTERM (Kubernetes, systemd, ``docker stop``) stops it as SIGINT does: uvicorn stops
accepting, lets the requests in flight finish, runs the app's shutdown, and
:func:`serve_forever` returns. (uvicorn re-raises the signal it caught once it has restored
the handler it found; with Python's default there SIGTERM would kill the process, exit 143,
after the drain. :func:`serve_forever` puts its own handler there.)
"""

from __future__ import annotations

import contextlib
import errno
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from raycompat.errors import DataError

STARTUP_S = 120  # loading every pair's index happens before the port answers
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

logger = logging.getLogger(__name__)


class BindError(DataError):
    """The service's address cannot be bound: the port is in use, or the host is not an
    address of this machine (exit 1)."""


class StartError(DataError):
    """The app did not start (uvicorn logged why: its lifespan failed); exit 1."""


class _Server(uvicorn.Server):
    """uvicorn's server, saying where it listens once it does (uvicorn says so only for a
    socket it bound itself)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
            where = f"http://{host}:{self.config.port}"
            logger.info("listening on %s (Ctrl-C or SIGTERM stops it)", where)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, not yet listening (uvicorn listens once the app
    has started). ``SO_REUSEADDR``, as uvicorn's own: a restart reuses a port whose old
    connections linger in TIME_WAIT.

    Raises:
        BindError: one line naming the address and what to change.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            hint = "another process listens there: stop it, or give another --port"
        else:
            hint = "check --host: an address of this machine, or 0.0.0.0"
        raise BindError(
            f"cannot listen on {host}:{port}: {error.strerror or error}; {hint}"
        ) from None
    return sock


def serve_forever(app, sock: socket.socket, log_level: str = "info") -> None:
    """Serve ``app`` on the bound ``sock`` (:func:`bind`) until SIGINT or SIGTERM, then drain
    and return (see the module docstring).

    Raises:
        StartError: the app's startup failed (uvicorn logged the traceback).
        BindError: the port could not be listened on (another process bound it too).
    """
    host, port = sock.getsockname()[:2]
    # uvicorn's own access log off: the app logs each request (app.py, access_log)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False)
    server = _Server(config)

    def stop(signum, frame) -> None:  # also the handler uvicorn re-raises its signal to
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        server.run(sockets=[sock])
    except SystemExit as exit_:  # uvicorn's startup failure (exit 3, not ours to reuse)
        if exit_.code:
            raise StartError("the service did not start: its log above says why") from None
    except OSError as error:  # listen() lost a race for the port
        raise BindError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()


@contextlib.contextmanager
def running(app, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` in a thread while the block runs; yields its base URL
    (``http://127.0.0.1:<port>``); stops it (and its watcher) on leaving."""
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=bound, log_level="warning", access_log=False)
    )
    server.install_signal_handlers = lambda: None  # only the main thread may
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="raycompat-service", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + STARTUP_S
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the service on {host} did not start")
            time.sleep(0.02)
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
