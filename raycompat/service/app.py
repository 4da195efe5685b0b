"""The search service as an ASGI app (Starlette): the same app under uvicorn on one machine
(``raycompat serve``) and behind a cluster's HTTP proxy.

    POST /v1/search     {"gallery", "model" | "alias", "vectors": [[...]] | "ids": [...], "k"}
                        -> {"gallery", "model", ["alias",] "version", "index", "metric",
                            "hits": [[{"id", "score"}, ...], ...]}
    GET  /v1/galleries  what each (gallery, model) pair and each named alias serves, or why
                        it serves nothing
    GET  /healthz       {"status": "ok", "pairs": N, "aliases": A}
    GET  /metrics       Prometheus text (``metrics.py``)

Each search takes one snapshot of its pair at its start (``served.py``) and is answered from
it alone, so an answer names exactly the version and index build it came from. Errors are
``{"error": message}``: 400 (a field, and its row, named: ``requests.py``), 401 (no or a
wrong bearer token, on every endpoint), 404 (unknown gallery, model or alias, the valid names
listed; revoked or retired), 409 (an alias asked with a model it does not point at), 413
(body over the limit), 503 (the records name a version this replica cannot load). faiss runs
in a worker thread, never on the event loop.
"""

from __future__ import annotations

import contextlib
import hmac
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
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
    check_vectors,
    parse_search,
)
from raycompat.service.served import NotServedError, Served
from raycompat.service.shadow import Shadow
from raycompat.service.watcher import Watcher

ENDPOINTS = ("/v1/search", "/v1/galleries", "/healthz", "/metrics")


def create_app(served: Served, config: ServiceConfig | None = None) -> Starlette:
    """The app serving ``served`` (a :class:`Served` of a store) under ``config``. Starting it
    loads every pair (:meth:`Served.refresh`) and starts the watcher; stopping it stops it."""
    config = config or ServiceConfig()
    shadow = Shadow(served.store, config.shadow, served.metrics) if config.shadow else None

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await run_in_threadpool(served.refresh)
        watcher = Watcher(served, config.poll_s)
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
        return JSONResponse(await run_in_threadpool(answer, served, asked, config, shadow))

    async def galleries(request: Request) -> Response:
        listing = served.listing()
        return JSONResponse({"galleries": listing["model"], "aliases": listing["alias"]})

    async def healthz(request: Request) -> Response:
        listing = served.listing()
        pairs, aliases = (sum(map(len, listing[kind].values())) for kind in ("model", "alias"))
        return JSONResponse({"status": "ok", "pairs": pairs, "aliases": aliases})

    async def metrics(request: Request) -> Response:
        return Response(served.metrics.text(), media_type=served.metrics.content_type)

    routes = [
        Route("/v1/search", search, methods=["POST"]),
        Route("/v1/galleries", galleries),
        Route("/healthz", healthz),
        Route("/metrics", metrics),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={RaycompatError: _error_response},
    )
    return Guard(app, config.token, served)


def answer(
    served: Served, asked: SearchRequest, config: ServiceConfig, shadow: Shadow | None = None
) -> dict:
    """The answer to one search, from one snapshot of its pair; ``shadow`` is handed the
    queries and the hits afterwards (it compares in the background)."""
    from raycompat.index.query import adapted, ranked_hits

    loaded: Loaded = served.for_request(asked.route(), config.check_each_request)
    if asked.alias is not None and asked.model not in (None, loaded.model):
        raise AliasMovedError(
            f"model: alias {asked.alias} of gallery {asked.gallery} points at version "
            f"{loaded.version} searched by model {loaded.model} now, not model {asked.model}"
        )
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


class Guard:
    """ASGI middleware in front of every endpoint: the bearer token (compared in constant
    time, never logged) and the request count and latency by endpoint and status."""

    def __init__(self, app, token: str | None, served: Served) -> None:
        self.app, self.served = app, served
        self.expected = None if token is None else f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def sent(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        if self.expected is not None and not self._authorized(scope):
            denied = JSONResponse(
                {"error": "missing or wrong bearer token (Authorization: Bearer <token>)"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await denied(scope, receive, sent)
        else:
            await self.app(scope, receive, sent)
        endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
        self.served.metrics.answered(endpoint, status[0], time.perf_counter() - start)

    def _authorized(self, scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(given, self.expected)
