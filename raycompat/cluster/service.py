"""The search service as a Ray Serve application: the same ASGI app as ``raycompat serve``
(``raycompat/service/app.py``) behind Ray Serve's HTTP proxy, for clusters.

Each replica builds its own app when it starts (``__serve_build_asgi_app__``): it opens the
store, loads every route's index once and starts its own watcher, so replicas follow the
serving records independently and each answer names the version it came from. Ray Serve runs
the app's lifespan (the first load, the watcher) as uvicorn does. Replicas, autoscaling and
resources come from a :class:`~raycompat.config.serve.ServeJobConfig` (``deployment``):

    serve run raycompat.cluster.service:app config=configs/deploy_demo.yaml [key.sub=value ...]
    ray job submit --working-dir . -- python jobs/deploy.py --config configs/deploy_demo.yaml

or from Python: ``serve.run(search_application(load_config(ServeJobConfig, path)))``.
"""

from __future__ import annotations

from ray import serve

from raycompat.config import load_config
from raycompat.config.serve import ServeJobConfig
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


def search_application(cfg: ServeJobConfig, service: ServiceConfig | None = None):
    """The bound application ``serve.run`` takes: :class:`SearchService` deployed as
    ``cfg.deployment`` says, over ``cfg.store`` (a local root made absolute here: replicas
    run elsewhere), enforcing ``service`` (default: built from ``cfg.service``, its token read
    here, once)."""
    root = cfg.store.checked_root()
    deployment = serve.deployment(SearchService, **cfg.deployment.options())
    service = service or ServiceConfig.from_spec(cfg.service)
    return deployment.bind(root, cfg.store.storage_options, service)


def app(args: dict):
    """The application builder of ``serve run raycompat.cluster.service:app config=FILE
    [key.sub=value ...]``: ``config`` is a :class:`ServeJobConfig` YAML file (optional), every
    other argument an override of its keys."""
    args = dict(args)
    path = args.pop("config", None)
    overrides = [f"{key}={value}" for key, value in args.items()]
    return search_application(load_config(ServeJobConfig, path, overrides))
