"""Typed config of the search service on a Ray cluster (``jobs/deploy.py`` and
``serve run raycompat.cluster.service:app config=...``); unknown keys are errors. No Ray.

    store:       where the galleries live (root, storage_options)
    service:     what each replica enforces and how it follows the store (ServiceSettings,
                 each default and range declared once; the token comes from a file or
                 RAYCOMPAT_SERVE_TOKEN, never YAML)
    deployment:  the Ray Serve application: name, route, replicas or autoscaling, resources
    http:        where the job starts Serve's HTTP proxy (when Serve is not running yet)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from raycompat.config import bounded, check_ranges
from raycompat.errors import ConfigError


@dataclass
class ServeStore:
    """The store served: a local directory (made absolute before the replicas see it) or
    ``s3://bucket/prefix`` with its s3fs ``storage_options``."""

    root: str = ""
    storage_options: dict = field(default_factory=dict)

    def checked_root(self) -> str:
        """``root``, a local one made absolute (replicas run elsewhere); unset is a
        :class:`ConfigError`."""
        if not self.root:
            raise ConfigError("store.root must be set: the store the service searches")
        return self.root if "://" in self.root else os.path.abspath(self.root)


@dataclass
class ServiceSettings:
    """What a search service replica enforces and how it follows the store: each setting's
    default and range, declared once here. The config keys (:class:`ServiceSpec`),
    ``raycompat serve``'s options (their defaults read from here) and the service's own
    ``ServiceConfig`` (``raycompat/service/config.py``) all extend or read this class.

    Attributes:
        max_k: hits per query a request may ask for.
        max_batch: query rows (vectors or ids) in one request.
        max_body_bytes: a larger request body is answered 413 before it is parsed.
        poll_s: seconds between two reads of the serving records by the watcher.
        check_each_request: before each search, count the model's alias records and look for
            its retired tombstone (a listing and a stat, no record read) and follow a change
            at once, so an answer never comes from a version the records no longer serve;
            False: only the watcher follows (an answer may lag a change by up to ``poll_s``
            plus a load).
        probe_auth: the probes (``/healthz``, ``/readyz``) ask the token too; False (the
            default): they are open, as a load balancer's health check and the kubelet's
            probes carry no token, and they tell only counts.
        access_log: one log line per request (``raycompat/service/app.py``); False: none.
    """

    max_k: int = bounded(1000, ge=1)
    max_batch: int = bounded(1000, ge=1)
    max_body_bytes: int = bounded(8 * 1024 * 1024, ge=1)
    poll_s: float = bounded(1.0, gt=0)
    check_each_request: bool = True
    probe_auth: bool = False
    access_log: bool = True

    def __post_init__(self) -> None:
        """The ranges, checked however the settings were built (YAML, options, Python); a
        :class:`ConfigError` naming the config key (``service.max_k must be >= 1, got 0``)."""
        for name in ("max_k", "max_batch", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"service.{name} must be an integer, got {value!r}")
        check_ranges(self, "service.")


@dataclass
class ServiceSpec(ServiceSettings):
    """The search service's settings as config keys (and as the options of ``raycompat
    serve``): :class:`ServiceSettings` and where the token and the shadow pairs come from.
    Plain data: the service builds its own config from it (``ServiceConfig.from_spec`` in
    ``raycompat/service/config.py``, which reads the token), so this layer never imports the
    service."""

    token_file: str | None = None  # else RAYCOMPAT_SERVE_TOKEN, else no token
    shadow: list[str] = field(default_factory=list)  # "G/M=V" each


@dataclass
class AutoscalingSpec:
    """Ray Serve's autoscaling of the replicas (``autoscaling_config``): between
    ``min_replicas`` and ``max_replicas``, aiming at ``target_ongoing_requests`` per replica."""

    min_replicas: int = bounded(1, ge=0)
    max_replicas: int = bounded(4, ge=1)
    target_ongoing_requests: float = bounded(8.0, gt=0)

    def __post_init__(self) -> None:
        if self.min_replicas > self.max_replicas:
            raise ConfigError(
                f"deployment.autoscaling: min_replicas {self.min_replicas} is above "
                f"max_replicas {self.max_replicas}"
            )


@dataclass
class DeploymentSpec:
    """The Ray Serve application. ``autoscaling`` set: the replicas scale within it, and
    ``num_replicas`` must stay unset; else ``num_replicas`` (default 1) fixed replicas. Each
    replica reserves ``num_cpus``, ``num_gpus`` and ``memory_gb`` (0: no reservation) and
    holds every served index in its memory."""

    name: str = "raycompat-search"
    route_prefix: str = "/"
    num_replicas: int | None = None
    autoscaling: AutoscalingSpec | None = None
    num_cpus: float = bounded(1.0, ge=0)
    num_gpus: float = bounded(0.0, ge=0)
    memory_gb: float = bounded(0.0, ge=0)
    max_ongoing_requests: int = bounded(32, ge=1)

    def __post_init__(self) -> None:
        if self.autoscaling is not None and self.num_replicas is not None:
            raise ConfigError(
                "deployment: give num_replicas or autoscaling, not both (autoscaling sets the "
                "replicas between its min_replicas and max_replicas)"
            )
        if self.num_replicas is not None and self.num_replicas < 1:
            raise ConfigError(f"deployment.num_replicas must be >= 1, got {self.num_replicas}")

    def options(self) -> dict:
        """The keyword arguments of ``serve.deployment`` these settings mean."""
        if self.autoscaling is not None:
            replicas = {"autoscaling_config": {**vars(self.autoscaling)}}
        else:
            replicas = {"num_replicas": self.num_replicas or 1}
        resources = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory_gb:
            resources["memory"] = int(self.memory_gb * 2**30)
        return {
            "name": "SearchService",
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": resources,
            **replicas,
        }


@dataclass
class HttpSpec:
    """Where Serve's HTTP proxy listens when the job starts Serve (a running Serve keeps its
    own: ``serve start --http-host H --http-port P`` sets it for ``serve run``)."""

    host: str = "127.0.0.1"
    port: int = bounded(8000, ge=1, le=65535)


@dataclass
class ServeJobConfig:
    """The search service as a Ray Serve application (docs/serving.md, "On a cluster")."""

    store: ServeStore = field(default_factory=ServeStore)
    service: ServiceSpec = field(default_factory=ServiceSpec)
    deployment: DeploymentSpec = field(default_factory=DeploymentSpec)
    http: HttpSpec = field(default_factory=HttpSpec)
    ray_address: str | None = None
