"""``raycompat serve --store S``: the search service on one machine (uvicorn), following the
store's serving records (``raycompat/service/``, docs/serving.md).

It binds 127.0.0.1 unless ``--host`` says otherwise, and binds before it loads anything: a
port in use is one line, exit 1; a port outside 1-65535 a usage error, exit 2. The bearer
token comes from ``--token-file`` or ``RAYCOMPAT_SERVE_TOKEN`` and is never printed; the probes
are open unless ``--probe-auth``. Each request is logged in one line unless
``--no-access-log``. It runs until Ctrl-C or SIGTERM, lets the requests in flight finish, and
then answers one line, exit 0. (``promotion.py`` beside it holds promote, rollback, revoke and
retire: the records this service follows.)
"""

from __future__ import annotations

import argparse

from raycompat.cli.arguments import STORE, positive_int
from raycompat.cli.command import Command
from raycompat.cli.store_options import add_store_arguments, open_store

DEFAULT_PORT = 8321
PORTS = range(1, 65536)


def serve(args) -> str:
    from raycompat.config.serve import ServiceSpec
    from raycompat.service import Served, ServiceConfig, create_app
    from raycompat.service.run import bind, serve_forever

    spec = ServiceSpec(
        max_k=args.max_k,
        max_batch=args.max_batch,
        max_body_bytes=args.max_body_bytes,
        poll_s=args.poll_s,
        check_each_request=not args.poll_only,
        token_file=args.token_file,
        probe_auth=args.probe_auth,
        access_log=args.access_log,
        shadow=list(args.shadow),
    )
    config = ServiceConfig.from_spec(spec, options=True)
    store = open_store(args)
    sock = bind(args.host, args.port)  # before any index loads: a port in use fails at once
    serve_forever(create_app(Served(store), config), sock)
    return f"stopped serving {store.uri()} on {args.host}:{args.port}"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if value not in PORTS:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port: give 1 to 65535")
    return value


def _positive_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def _arguments(p: argparse.ArgumentParser) -> None:
    from raycompat.config.serve import ServiceSettings

    default = ServiceSettings()  # each setting's default, declared once there
    add_store_arguments(p)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 for every "
        "interface, with a --token-file)",
    )
    p.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"1 to 65535 (default {DEFAULT_PORT})"
    )
    p.add_argument(
        "--token-file",
        help="a file whose first line is the bearer token every request must carry (default: "
        "the environment's RAYCOMPAT_SERVE_TOKEN; neither: no token asked)",
    )
    p.add_argument(
        "--probe-auth",
        action="store_true",
        help="the probes (/healthz, /readyz) ask the token too; by default they are open, as a "
        "load balancer's health check and the kubelet's probes carry none (they tell only counts)",
    )
    p.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="no log line per request (by default: client, method, path, status, latency, the "
        "route searched; never a body or the token)",
    )
    p.add_argument("--poll-s", type=_positive_s, default=default.poll_s, help="seconds between "
                   f"polls of the serving records (default {default.poll_s:g})")  # fmt: skip
    p.add_argument(
        "--poll-only",
        action="store_true",
        help="follow the records only by polling; by default each search first checks its "
        "model's records (a listing and a stat), so no answer lags a promote, rollback or revoke",
    )
    p.add_argument(
        "--shadow",
        action="append",
        default=[],
        metavar="G/M=V",
        help="also search version V with model M's queries on gallery G, in the background, "
        "measuring overlap@k and negative flips (/metrics); repeatable",
    )
    p.add_argument("--max-k", type=positive_int, default=default.max_k, help="most hits per query")
    p.add_argument(
        "--max-batch", type=positive_int, default=default.max_batch, help="most queries a request"
    )
    p.add_argument(
        "--max-body-bytes", type=positive_int, default=default.max_body_bytes, help="larger: 413"
    )


COMMANDS = (
    Command(
        "serve",
        "serve searches over HTTP from warm indexes, following promote, rollback, revoke and "
        "retire",
        _arguments,
        serve,
        example=f"raycompat serve --store {STORE} --port {DEFAULT_PORT}",
        as_json=False,
    ),
)
