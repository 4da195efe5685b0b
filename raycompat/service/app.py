"""The search service as an ASGI app (Starlette): the same app under uvicorn on one machine
(``raycompat serve``) and behind a cluster's HTTP proxy.

    POST /v1/search     {"gallery", "model" | "alias", "vectors": [[...]] | "ids": [...], "k"}
                        -> {"gallery", "model", ["alias",] "version", "index", "metric",
                            "hits": [[{"id", "score"}, ...], ...]}
    GET  /v1/galleries  what each (gallery, model) pair and each named alias serves, or why
                        it serves nothing
    GET  /healthz       liveness: {"status": "ok", "pairs": N, "aliases": A} (loaded now)
    GET  /readyz        readiness: 200 {"ready": true, ...}, or 503 {"ready": false, "error",
                        ...} while every route it should serve is unloadable
    GET  /metrics       Prometheus text (``metrics.py``)

Each search takes one snapshot of its pair at its start (``served.py``) and is answered from
it alone, so an answer names exactly the version and index build it came from. Every error is
JSON, ``{"error": message}``: 400 (a field, and its row, named: ``requests.py``), 401 (no or a
wrong bearer token), 404 (unknown gallery, model or alias, the valid names listed; revoked or
retired; an unknown path), 405 (a method the path does not take), 409 (an alias asked with a
model it does not point at), 413 (body over the limit), 500 (a bug, logged), 503 (the records
name a version this replica cannot load). faiss runs in a worker thread, never on the event
loop.

The token guards every endpoint but the probes (``/healthz``, ``/readyz``), which a load
balancer or the kubelet calls without one and which tell only counts; ``probe_auth`` guards
them too. Each request is logged in one line (``access_log``): client, method, path, status,
latency, and for a search the route and the version that answered; never a body or a header.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from raycompat.errors import RaycompatError, StoreError, UsageError
from raycompat.index.distances import ZeroNormError
from raycompat.service.config import ServiceConfig
from raycompat.service.loaded import Loaded
from raycompat.service.requests import (
    AliasMovedError,
    BadRequest,
    BodyTooLarge,
    SearchRequest,
    check_alias_model,
    check_vectors,
    parse_search,
)
from raycompat.service.served import NotServedError, Served
from raycompat.service.shadow import Shadow
from raycompat.service.watcher import Watcher

ENDPOINTS = {
    "/v1/search": "POST",
    "/v1/galleries": "GET",
    "/healthz": "GET",
    "/readyz": "GET",
    "/metrics": "GET",
}
PROBES = ("/healthz", "/readyz")
SEARCHED = "raycompat.searched"  # scope key: what a search searched, for the access log

access_logger = logging.getLogger("raycompat.service.access")


def create_app(served: Served, config: ServiceConfig | None = None) -> Starlette:
    """The app serving ``served`` (a :class:`Served` of a store) under ``config``. Starting it
    loads every pair (:meth:`Served.refresh`) and starts the watcher; stopping it stops it."""
    config = config or ServiceConfig()
    shadow = Shadow(served.store, config.shadow, served.metrics) if config.shadow else None

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await run_in_threadpool(served.refresh)
        watcher = Watcher(served.refresh, config.poll_s)
        watcher.start()
        try:
            yield
        finally:
            watcher.stop()
            if shadow is not None:
                shadow.close()

    async def search(request: Request) -> Response:
        body = await _limited_body(request, config.max_body_bytes)
        asked = parse_search(body, config.max_k, config.max_batch)
        request.scope[SEARCHED] = str(asked.route())
        answered = await run_in_threadpool(answer, served, asked, config, shadow)
        request.scope[SEARCHED] += f" {answered['version']}"
        return JSONResponse(answered)

    async def galleries(request: Request) -> Response:
        listing = served.listing()
        return JSONResponse({"galleries": listing["model"], "aliases": listing["alias"]})

    async def healthz(request: Request) -> Response:
        counts = served.counts()
        return JSONResponse(
            {"status": "ok", "pairs": counts["pairs"], "aliases": counts["aliases"]}
        )

    async def readyz(request: Request) -> Response:
        return readiness(served)

    async def metrics(request: Request) -> Response:
        return Response(served.metrics.text(), media_type=served.metrics.content_type)

    routes = [
        Route("/v1/search", search, methods=["POST"]),
        Route("/v1/galleries", galleries),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            RaycompatError: _error_response,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
    )
    return Guard(app, config, served)


def readiness(served: Served) -> JSONResponse:
    """``/readyz``: 200 while some route answers (:meth:`Served.ready`), else 503. Counts
    only: the probe may be open, and ``/v1/galleries`` says why."""
    counts = served.counts()
    if served.ready():
        return JSONResponse({"ready": True, **counts})
    error = (
        f"not ready: the {counts['unloadable']} route(s) to serve cannot be loaded here "
        "(GET /v1/galleries says why; the watcher tries again at each poll)"
    )
    return JSONResponse({"ready": False, "error": error, **counts}, status_code=503)


def answer(
    served: Served, asked: SearchRequest, config: ServiceConfig, shadow: Shadow | None = None
) -> dict:
    """The answer to one search, from one snapshot of its pair; ``shadow`` is handed the
    queries and the hits afterwards (it compares in the background)."""
    from raycompat.serving.ranking import ranked_hits
    from raycompat.serving.version_space import adapted

    loaded: Loaded = served.for_request(asked.route(), config.check_each_request)
    check_alias_model(asked.alias, asked.model, loaded)
    if asked.ids is not None:
        try:
            queries = loaded.stored(served.store, asked.ids)
        except StoreError as error:
            raise _bad("ids", error) from None
    else:
        check_vectors(asked.vectors, loaded.width, loaded.model)
        queries = asked.vectors
        queries = queries if loaded.adapter is None else adapted(loaded.adapter, queries)
    try:
        hits, _ = ranked_hits(loaded.index, queries, asked.k, model=loaded.model)
    except ZeroNormError as error:
        raise _bad("ids" if asked.ids is not None else "vectors", error) from None
    if shadow is not None:
        shadow.observe(loaded, queries, asked.ids, [ids for _, ids in hits], asked.k)
    return {
        "gallery": loaded.gallery,
        "model": loaded.model,
        **({"alias": asked.alias} if asked.alias is not None else {}),
        "version": loaded.version,
        "index": loaded.source,
        "metric": loaded.metric,
        "hits": [
            [{"id": i, "score": s} for i, s in zip(ids.tolist(), scores.tolist(), strict=True)]
            for scores, ids in hits
        ],
    }


def _bad(field: str, error: Exception) -> BadRequest:
    return BadRequest(f"{field}: {error}")


async def _limited_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it passes ``limit`` bytes (a declared length first)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body: {declared} bytes, over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body: over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def status_of(error: RaycompatError) -> int:
    """The HTTP status of an error a request ran into (see the module docstring)."""
    if isinstance(error, NotServedError):
        return 404
    if isinstance(error, BodyTooLarge):
        return 413
    if isinstance(error, AliasMovedError):
        return 409
    return 400 if isinstance(error, UsageError) else 503


async def _error_response(request: Request, error: RaycompatError) -> Response:
    return JSONResponse({"error": str(error)}, status_code=status_of(error))


async def _http_error(request: Request, error: HTTPException) -> Response:
    """404 (no such path) and 405 (a method the path does not take), as JSON like the rest."""
    what = f"{request.method} {request.url.path}"
    endpoints = ", ".join(f"{method} {path}" for path, method in ENDPOINTS.items())
    if error.status_code == 404:
        message = f"no endpoint {what}: the endpoints are {endpoints}"
    elif error.status_code == 405:
        allowed = ", ".join(sorted(error.headers["Allow"].split(", ")))  # a set's order
        message = f"{what}: method not allowed; {request.url.path} takes {allowed}"
    else:
        message = f"{what}: {error.detail}"
    return JSONResponse({"error": message}, status_code=error.status_code, headers=error.headers)


async def _internal_error(request: Request, error: Exception) -> Response:
    """A bug: JSON like every other error; Starlette re-raises it, and uvicorn logs it."""
    return JSONResponse({"error": "internal error (logged by the service)"}, status_code=500)


class Guard:
    """ASGI middleware in front of every endpoint: the bearer token (compared in constant
    time, never logged; the probes open unless ``config.probe_auth``), the request count and
    latency by endpoint and status, and the access log line (``config.access_log``)."""

    def __init__(self, app, config: ServiceConfig, served: Served) -> None:
        self.app, self.served, self.access_log = app, served, config.access_log
        self.expected = None if config.token is None else f"Bearer {config.token}".encode()
        self.open = () if config.probe_auth else PROBES

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def sent(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self._authorized(scope):
                await self.app(scope, receive, sent)
            else:
                denied = JSONResponse(
                    {"error": "missing or wrong bearer token (Authorization: Bearer <token>)"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await denied(scope, receive, sent)
        finally:
            seconds = time.perf_counter() - start
            endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
            self.served.metrics.answered(endpoint, status[0], seconds)
            if self.access_log:
                _log_access(scope, status[0], seconds)

    def _authorized(self, scope) -> bool:
        if self.expected is None or scope["path"] in self.open:
            return True
        given = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(given, self.expected)


def _log_access(scope, status: int, seconds: float) -> None:
    """One line: client, method, path (no query string), status, latency and what a search
    searched (``g/m1 v1``); never a body or a header, so never a vector or the token."""
    host, port = scope.get("client") or ("-", 0)
    searched = scope.get(SEARCHED)
    access_logger.info(
        "%s:%d %s %s %d %.1f ms%s", host, port, scope["method"], scope["path"], status,
        1000 * seconds, f" {searched}" if searched else "",
    )  # fmt: skip
