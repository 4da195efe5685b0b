"""The service's Prometheus metrics, in a registry of its own (``prometheus_client``).

    raycompat_requests_total{endpoint, status}       requests answered
    raycompat_request_seconds{endpoint}              latency histogram
    raycompat_swaps_total{gallery, model}            versions swapped (a revoke is a swap to
                                                     nothing)
    raycompat_serving{gallery, model, version}       1 for the version each pair serves now
    raycompat_alias_swaps_total{gallery, alias}      the same for named aliases (``prod``),
    raycompat_alias_serving{gallery, alias, model, version}   with the model they point at
    raycompat_indexes_freed_total                    old indexes freed after their last request
    raycompat_shadow_overlap_at_k{gallery, model, candidate}       shadow traffic (shadow.py):
    raycompat_shadow_labelled_queries_total{...}                   overlap@k per query, and the
    raycompat_shadow_negative_flips_total{...}                     negative flips among labelled
    raycompat_shadow_skipped_total{...}                            queries; skipped comparisons

``GET /metrics`` answers :meth:`ServiceMetrics.text` (the text exposition format).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
# 0.5 ms to 10 s: a warm flat search of a small gallery to a swap that loads an index
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class ServiceMetrics:
    """One replica's metrics (a registry per instance, so tests and replicas never share)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "raycompat_requests", "requests answered", ["endpoint", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "raycompat_request_seconds", "request latency", ["endpoint"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.swaps = Counter(
            "raycompat_swaps", "versions swapped", ["gallery", "model"], registry=self.registry
        )
        self.serving = Gauge(
            "raycompat_serving", "1 for the version a (gallery, model) pair serves now",
            ["gallery", "model", "version"], registry=self.registry,
        )  # fmt: skip
        self.alias_swaps = Counter(
            "raycompat_alias_swaps", "named alias swaps", ["gallery", "alias"],
            registry=self.registry,
        )  # fmt: skip
        self.alias_serving = Gauge(
            "raycompat_alias_serving", "1 for the (version, model) pair a named alias serves now",
            ["gallery", "alias", "model", "version"], registry=self.registry,
        )  # fmt: skip
        self.freed = Counter(
            "raycompat_indexes_freed", "old indexes freed after their last request",
            registry=self.registry,
        )  # fmt: skip

        shadow = ["gallery", "model", "candidate"]
        self.shadow_overlap = Histogram(
            "raycompat_shadow_overlap_at_k", "overlap@k of the served and the candidate top-k",
            shadow, buckets=[i / 10 for i in range(11)], registry=self.registry,
        )  # fmt: skip
        self.shadow_labelled = Counter(
            "raycompat_shadow_labelled_queries", "shadowed queries with a stored label", shadow,
            registry=self.registry,
        )  # fmt: skip
        self.shadow_flips = Counter(
            "raycompat_shadow_negative_flips", "served top-1 right, candidate top-1 wrong",
            shadow, registry=self.registry,
        )  # fmt: skip
        self.shadow_skipped = Counter(
            "raycompat_shadow_skipped", "comparisons skipped: too many waiting", shadow,
            registry=self.registry,
        )  # fmt: skip

    def answered(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def swapped(self, route, old, new) -> None:
        """``route`` went from serving ``old`` to ``new`` (each a ``Loaded`` or None)."""
        alias = route.kind == "alias"
        (self.alias_swaps if alias else self.swaps).labels(route.gallery, route.name).inc()
        gauge = self.alias_serving if alias else self.serving

        def labels(loaded) -> tuple:
            model = (loaded.model,) if alias else ()
            return route.gallery, route.name, *model, loaded.version

        if old is not None:
            gauge.remove(*labels(old))
        if new is not None:
            gauge.labels(*labels(new)).set(1)

    def freed_index(self, what: str) -> None:
        self.freed.inc()

    content_type = CONTENT_TYPE

    def text(self) -> bytes:
        return generate_latest(self.registry)
