"""The control plane of serving, between the data plane (``store/``, ``index/``) and the search
service (``service/``): which version each query model serves, the named aliases, which pairs
are compatible, and the query path a search takes. No Ray, no argparse.

What a model serves and why:

    served_log.py        the per-model served-version log: promote, revoke, rollback, current
                         (``<gallery>/_aliases/<model>/``)
    aliases.py           named aliases (``prod``): a compatible (version, model) pair, swapped
                         and rolled back (``<gallery>/_named/<alias>/``)
    compatible_pairs.py  which model may search which version: a named alias's gate
    serving_map.py       the live serving map: what gc keeps (its caller passes it), what
                         ``raycompat history`` shows
    history.py           a gallery's story: versions, decisions, grants
    query_access.py      the grant a transform job's model gets on the version it wrote
    query_adapters.py    query-side maps stored beside a version, and loaded for a search
    adapt.py             fit a query-side map on paired rows (``raycompat adapt``)

The query path (``raycompat search``, the Python API, the service):

    resolve.py           the version a model serves, or a named alias points at
    query_inputs.py      the queries, checked: a file, an array, stored ids or images
    query_images.py      images embedded with the store's model (the one part that runs it)
    stored_rows.py       rows of a version found by id
    version_space.py     queries mapped by the model's query adapter, or as they are
    ranking.py           the top-k at the index's width, the one ranking every search does
    labels.py            the stored labels of the hits
    query_path.py        search(): all of it in one call; search_gallery() from vectors

Exported lazily: ``import raycompat.serving`` imports none of the modules.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "query_path": ("QueryHits", "SearchResult", "search", "search_gallery"),
        "query_inputs": ("QueryError", "query_problem", "query_vectors", "read_query_vectors"),
        "query_images": ("embed_images",),
        "resolve": ("aliased_version", "served_version"),
        "stored_rows": ("stored_vectors",),
        "version_space": ("to_version_space",),
        "ranking": ("to_width",),
        "adapt": ("PairsFileError", "adapt_queries"),
    },
)
