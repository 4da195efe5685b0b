"""``raycompat search GALLERY``: top-k gallery ids for query images, vectors or stored ids.

The query path is the core's (``serving/query_path.py``: :func:`search`, which the service uses
too); this command parses, prints notes on stderr and renders (the second line names what the
scores are and which index answered). It finds the gallery version model M serves (or the
version and model a named alias, ``--alias prod``, points at: :func:`aliased_version`), embeds
the images with M (or takes ``--vectors`` / ``--ids``) and searches that version's published
faiss index, else a small version exactly in memory; it never writes the store. No Ray; torch
only to embed images.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from raycompat.cli.arguments import STORE, add_gallery, positive_int
from raycompat.cli.command import PROG, Command
from raycompat.cli.store_options import add_store_arguments, open_store
from raycompat.cli.tables import table


def search(args) -> dict:
    """Top-k hits per query (only items found). faiss prints from C++ to the process's stdout
    while it loads an index: sent to stderr here."""
    from raycompat.index.stdout import stdout_to_stderr  # faiss prints: only this command loads it
    from raycompat.serving.query_inputs import check_k

    check_k(args.k)
    with stdout_to_stderr():
        return _search(args)


def _search(args) -> dict:
    from raycompat.serving.query_path import search as search_as

    store = open_store(args)

    def note(line: str) -> None:
        print(f"{PROG}: note: {line}", file=sys.stderr)

    model, version, relation = _searched_pair(store, args, note)
    # Read-only: the published index, else an exact in-memory search of a small version.
    result = search_as(
        store,
        args.gallery,
        model,
        images=args.images,
        vectors=args.vectors,
        ids=args.ids,
        k=args.k,
        version=version,
        nprobe=args.nprobe,
        on_note=note,
    )
    names = args.images or args.ids or [f"{args.vectors}[{q}]" for q in range(len(result.hits))]
    return {
        "gallery": args.gallery,
        "gallery_version": version,
        "relation": relation,
        "model": model,
        "alias": args.alias,
        "index": result.index,
        "metric": result.metric,
        "results": [
            {
                "query": str(name),
                "image": name if args.images else None,
                # as stored, as the service answers them: integers for int64 ids, else text
                "ids": hits.ids.tolist(),
                # finite for every hit of finite vectors; None keeps --json valid JSON regardless
                "scores": [s if math.isfinite(s) else None for s in hits.scores.tolist()],
                "labels": hits.labels,
            }
            for name, hits in zip(names, result.hits, strict=True)
        ],
    }


def _searched_pair(store, args, note) -> tuple[str | None, str, str | None]:
    """``(model, version, relation)``: the pair ``--alias`` points at, else ``--model`` and
    :func:`_searched_version`."""
    from raycompat.serving.resolve import aliased_version

    if args.alias is None:
        return (args.model, *_searched_version(store, args, note))
    served = aliased_version(store, args.gallery, args.alias)
    return served.model_version, served.gallery_version, served.relation


def _searched_version(store, args, note) -> tuple[str, str | None]:
    """``(version, relation)``: the version ``--model`` serves (its alias, else its grant) and
    how it relates to it; or ``--version`` as asked, with the relation when the model serves
    it (else None, and a note when a model was given)."""
    from raycompat.errors import StoreError
    from raycompat.serving.resolve import served_version
    from raycompat.store.catalog.models import Catalog
    from raycompat.store.read.lookup import model_record, version_record

    # unknown names list those that exist; the model's alias, else its grant (serving/served_log.py)
    if args.version is None:
        served = served_version(store, args.gallery, args.model)
        return served.gallery_version, served.relation
    version_record(store, args.gallery, args.version)
    if args.model is None:
        return args.version, None
    model_record(Catalog(store), args.model)
    try:
        served = served_version(store, args.gallery, args.model)
    except StoreError:  # no grant, revoked or retired there: --version searches regardless
        served = None
    if served is not None and served.gallery_version == args.version:
        return args.version, served.relation
    serves = f"serves {served.gallery_version}" if served else "serves no version of it"
    note(f"model {args.model} {serves}; searching {args.gallery} {args.version} as asked")
    return args.version, None


def check_queries(args) -> str | None:
    """One kind of query, and every image there; a model or a version to search."""
    if sum(map(bool, (args.images, args.vectors, args.ids))) != 1:
        return "search takes images, --vectors or --ids (one of them)"
    if args.alias is not None and (args.model is not None or args.version is not None):
        return "--alias names the version and the query model: leave out --model and --version"
    if args.model is None and args.version is None and args.alias is None:
        return "search needs --model (searches the version it serves) or --version (or --alias)"
    if args.images and args.model is None and args.alias is None:
        return "query images need --model, the model that embeds them"
    missing = [p for p in args.images if not Path(p).is_file()]
    return f"query image(s) not found: {', '.join(missing)}" if missing else None


COLUMNS = [("query", "query"), ("rank", "rank"), ("id", "id"), ("score", "score")]


def render_search(out: dict) -> str:
    rows = [
        {"query": r["query"], "rank": rank + 1, "id": str(i), "score": s, "label": label}
        for r in out["results"]
        for rank, (i, s, label) in enumerate(zip(r["ids"], r["scores"], r["labels"], strict=True))
    ]
    if out["relation"] is not None:
        how = f"{out['relation']} for model {out['model']}"
        how += f", alias {out['alias']}" if out["alias"] else ""
    else:
        how = "as asked" + (f", queries of model {out['model']}" if out["model"] else "")
    head = f"gallery {out['gallery']} version {out['gallery_version']} ({how})"
    head += f"\nscore: {out['metric']} ({out['index']})"
    return head + "\n" + table(rows, COLUMNS + [("label", "label")])


def _arguments(p) -> None:
    add_gallery(p)
    p.add_argument("images", nargs="*", default=[], help="query images, embedded with --model")
    p.add_argument("--vectors", help="query vectors of --model: a .npy (Q, d) or a Parquet file")
    p.add_argument("--ids", nargs="+", help="query with rows stored in the version searched")
    add_store_arguments(p)
    p.add_argument(
        "--model",
        help="a registered model version: embeds the query images, and without --version the "
        "gallery version it serves is searched",
    )
    p.add_argument(
        "--version",
        help="search this gallery version directly (with --vectors or --ids, --model may be "
        "left out; a model that does not serve it gets a note)",
    )
    p.add_argument(
        "--alias",
        help="search the version a named alias (e.g. prod) points at, with its query model "
        "(raycompat alias list G shows them; instead of --model and --version)",
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
