"""The search service (issue 42): a long-lived ASGI app that answers searches from warm
indexes and follows the store's serving records (promote, rollback, revoke, retire). No Ray:
the same app runs under uvicorn (``raycompat serve``) and behind a cluster's HTTP proxy.

    config.py     ServiceConfig: limits, polling, the bearer token (read_token)
    loaded.py     one (gallery, model) pair loaded: a version's index, warm, and its query map
    served.py     Served: every pair, followed and swapped atomically (a newly published
                  index of a version served too); NotServedError (404)
    watcher.py    the thread that polls the serving records
    gallery.py    open_gallery: one gallery as a model or alias, for Python programs (a
                  route of a Served of its own and its watcher: the service's following)
    requests.py   POST /v1/search bodies, checked before faiss sees them
    app.py        create_app: the endpoints, the token guard, errors as HTTP statuses
    metrics.py    Prometheus metrics: requests, latency, swaps, the version each pair serves
    shadow.py     shadow traffic: a candidate version searched in the background, overlap@k
                  and negative flips measured
    run.py        the port bound first, then uvicorn in the foreground (SIGTERM drains as
                  SIGINT does), or in a thread for tests and benchmarks
    throttle.py   a warning repeated each poll, logged once a minute or on a change

docs/serving.md describes the endpoints, the swap and its guarantees.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "app": ("create_app",),
        "config": ("ServiceConfig", "read_token"),
        "served": ("NotServedError", "Served"),
        "gallery": ("Gallery", "GalleryClosedError", "open_gallery"),
        "run": ("running", "serve_forever"),
        "shadow": ("Shadow", "ShadowSpec"),
    },
)
