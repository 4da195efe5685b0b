"""faiss indexes beside the store: distances, search indexes, a version's index, sharded builds
(no Ray). Building, loading and searching indexes only: which version a model searches, its
queries and the one-shot ``search`` are the serving layer's (``raycompat.serving``), which
calls this package; this package never imports it.

What a user calls: :func:`build_version_index` and :func:`open_search_index`
(:mod:`.version_index`: a version's index, built and opened), :func:`build_index`
(:mod:`.factory`: a :class:`SearchIndex` by kind), :func:`estimate_recall` (:mod:`.recall`)
and :class:`TaskRunner` (:mod:`.tasks`: who runs a sharded build's tasks). faiss loads at the
first use of a name, so ``import raycompat.index`` stays cheap.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "version_index": (
            "IndexNeededError",
            "build_version_index",
            "load_version_index",
            "open_search_index",
        ),
        "factory": ("INDEX_KINDS", "build_index"),
        "search_index": ("SearchIndex", "brute_force_search", "real_hits"),
        "distances": ("DISTANCES", "ZeroNormError", "get_distance"),
        "recall": ("estimate_recall",),
        "tasks": ("LocalTasks", "TaskRunner"),
    },
)
