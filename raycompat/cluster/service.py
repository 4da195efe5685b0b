"""The search service as a Ray Serve application: the same ASGI app as ``raycompat serve``
(``raycompat/service/app.py``) behind Ray Serve's HTTP proxy, for clusters.

Each replica builds its own app when it starts (``__serve_build_asgi_app__``): it opens the
store, loads every pair's index once and starts its own watcher, so replicas follow the
serving records independently and each answer names the version it came from. Ray Serve runs
the app's lifespan (the first load, the watcher) as uvicorn does.

    from ray import serve
    from raycompat.cluster.service import search_application

    serve.run(search_application("s3://bucket/store", num_replicas=2), route_prefix="/")
"""

from __future__ import annotations

from ray import serve

from raycompat.service import Served, ServiceConfig, create_app
from raycompat.store import GalleryStore


@serve.ingress()
class SearchService:
    """One replica of the service over the store at ``store``."""

    def __init__(
        self, store: str, storage_options: dict | None = None, config: ServiceConfig | None = None
    ) -> None:
        self.store, self.storage_options = store, storage_options or {}
        self.config = config or ServiceConfig()

    def __serve_build_asgi_app__(self):
        return create_app(Served(GalleryStore(self.store, self.storage_options)), self.config)


def search_application(
    store: str,
    storage_options: dict | None = None,
    config: ServiceConfig | None = None,
    *,
    num_replicas: int = 1,
    num_cpus: float = 1,
):
    """The bound application ``serve.run`` takes: ``num_replicas`` replicas of
    :class:`SearchService`, ``num_cpus`` each."""
    deployment = serve.deployment(
        SearchService, num_replicas=num_replicas, ray_actor_options={"num_cpus": num_cpus}
    )
    return deployment.bind(store, storage_options, config)
