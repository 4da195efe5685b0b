"""``raycompat search GALLERY``: top-k gallery ids for query images, vectors or stored ids.

The query path is the core's (``index/query.py``: :func:`served_version`,
:func:`query_vectors`, :func:`search_gallery`); this command parses, prints notes on stderr and
renders. It finds the gallery version model M serves, embeds the images with M (or takes
``--vectors`` / ``--ids``) and searches that version's published faiss index, else a small
version exactly in memory; it never writes the store. No Ray; torch only to embed images.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from raycompat.cli.arguments import STORE, add_gallery, positive_int
from raycompat.cli.command import PROG, Command
from raycompat.cli.store_options import add_store_arguments, open_store
from raycompat.cli.tables import table


def search(args) -> dict:
    """Top-k hits per query (only items found). faiss prints from C++ to the process's stdout
    while it loads an index: sent to stderr here."""
    from raycompat.index.query import check_k
    from raycompat.index.stdout import stdout_to_stderr  # faiss prints: only this command loads it

    check_k(args.k)
    with stdout_to_stderr():
        return _search(args)


def _search(args) -> dict:
    from raycompat.index.query import query_vectors, search_gallery, served_version

    store = open_store(args)
    # unknown names list those that exist; the model's alias, else its grant (store/aliases.py)
    served = served_version(store, args.gallery, args.model)
    version = served.gallery_version
    queries = query_vectors(
        store,
        args.gallery,
        version,
        args.model,
        images=args.images,
        vectors=args.vectors,
        ids=args.ids,
    )
    names = args.images or args.ids or [f"{args.vectors}[{q}]" for q in range(len(queries))]
    # Read-only: the published index, else an exact in-memory search of a small version.
    result = search_gallery(
        store,
        args.gallery,
        queries,
        args.k,
        model=args.model,
        version=version,
        nprobe=args.nprobe,
        names=names,
        on_note=lambda note: print(f"{PROG}: note: {note}", file=sys.stderr),
    )
    return {
        "gallery": args.gallery,
        "gallery_version": version,
        "relation": served.relation,
        "model": args.model,
        "results": [
            {
                "query": str(name),
                "image": name if args.images else None,
                "ids": [str(i) for i in hits.ids.tolist()],
                # finite for every hit of finite vectors; None keeps --json valid JSON regardless
                "scores": [float(s) if np.isfinite(s) else None for s in hits.scores.tolist()],
                "labels": hits.labels,
            }
            for name, hits in zip(names, result.hits, strict=True)
        ],
    }


def check_queries(args) -> str | None:
    """One kind of query, and every image there."""
    if sum(map(bool, (args.images, args.vectors, args.ids))) != 1:
        return "search takes images, --vectors or --ids (one of them)"
    missing = [p for p in args.images if not Path(p).is_file()]
    return f"query image(s) not found: {', '.join(missing)}" if missing else None


COLUMNS = [("query", "query"), ("rank", "rank"), ("id", "id"), ("score", "score")]


def render_search(out: dict) -> str:
    rows = [
        {"query": r["query"], "rank": rank + 1, "id": i, "score": s, "label": label}
        for r in out["results"]
        for rank, (i, s, label) in enumerate(zip(r["ids"], r["scores"], r["labels"], strict=True))
    ]
    head = (
        f"gallery {out['gallery']} version {out['gallery_version']} "
        f"({out['relation']} for model {out['model']})"
    )
    return head + "\n" + table(rows, COLUMNS + [("label", "label")])


def _arguments(p) -> None:
    add_gallery(p, old_flag=True)
    p.add_argument(
        "images", nargs="*", default=[], help="query images, embedded with --model"
    )
    p.add_argument("--vectors", help="query vectors of --model: a .npy (Q, d) or a Parquet file")
    p.add_argument("--ids", nargs="+", help="query with rows stored in the version --model queries")
    add_store_arguments(p)
    p.add_argument(
        "--model",
        required=True,
        help="a registered model version; searches the gallery version it may query",
    )
    p.add_argument("-k", type=int, default=5, help="hits per query (default 5)")
    p.add_argument(
        "--nprobe",
        type=positive_int,
        default=None,
        help="inverted lists visited per query by an IVF index (default: the build's, which "
        "grows with the gallery; ignored by an exact flat index)",
    )


COMMANDS = (
    Command(
        "search",
        "top-k gallery ids for query images, vectors or stored ids",
        _arguments,
        search,
        render_search,
        example=f"raycompat search mnist --ids 17 --store {STORE} --model m1 -k 5",
        check=check_queries,
    ),
)
