"""faiss indexes beside the store: distances, search, a version's index, sharded builds (no Ray).

What a user calls: :func:`search` (:mod:`.query`: search a gallery as a model, or a given
version; the answer names the version, the index and the metric of its scores; it opens the
version's index at each call: a program that searches many times opens a gallery handle once,
``raycompat.open_gallery``),
:func:`build_version_index` and :func:`open_search_index` (:mod:`.version_index`: a version's
index, built and opened), :func:`build_index` (:mod:`.factory`: a
:class:`SearchIndex` by kind), :func:`adapt_queries` (:mod:`.adapt`: a query-side map fitted
on paired rows, for a training-free upgrade), :func:`estimate_recall` (:mod:`.recall`) and
:class:`TaskRunner` (:mod:`.tasks`: who runs a sharded build's tasks). faiss loads at the
first use of a name, so ``raycompat search --vectors`` answers without it where no index is
needed.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "query": (
            "QueryError",
            "QueryHits",
            "SearchResult",
            "embed_images",
            "query_problem",
            "query_vectors",
            "read_query_vectors",
            "search",
            "search_gallery",
            "served_version",
            "stored_vectors",
            "to_version_space",
            "to_width",
        ),
        "adapt": ("PairsFileError", "adapt_queries"),
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
