"""``raycompat galleries | versions | models``: what a store holds.

Each lists the readable records and names each corrupt one (file and error); a listing with a
corrupt record exits 1 (``cli/app.py``). The rows come from ``store/read/listing.py`` and the model
catalog; reading never writes the store.
"""

from __future__ import annotations

from raycompat.cli.arguments import STORE, add_gallery
from raycompat.cli.command import Command
from raycompat.cli.store_options import add_store_arguments, open_store
from raycompat.cli.tables import NO_WEIGHTS, corrupt_lines, mark_no_weights, table
from raycompat.errors import StoreError


def listing(out: dict, corrupt: list[tuple[str, str]]) -> dict:
    """``out`` with the unreadable records it skipped, each with its file and error."""
    if corrupt:
        out["corrupt"] = [{"file": uri, "error": error} for uri, error in corrupt]
    return out


# ---- galleries -------------------------------------------------------------------------------


def galleries(args) -> dict:
    """Every gallery of the store with its version count, newest version (model, rows) and the
    version each query model searches (``store/read/listing.py``)."""
    from raycompat.store.read.listing import gallery_summaries

    store = open_store(args)
    rows, corrupt = gallery_summaries(store)
    return listing({"store": store.uri(), "galleries": rows}, corrupt)


GALLERIES_COLUMNS = [
    ("gallery", "gallery"),
    ("versions", "versions"),
    ("newest", "newest"),
    ("model_version", "model"),
    ("rows", "rows"),
    ("query_models", "query models (-> version)"),
]


def render_galleries(out: dict) -> str:
    rows = [
        {**g, "query_models": [f"{m}->{v}" for m, v in g["query_models"].items()]}
        for g in out["galleries"]
    ]
    body = table(rows, GALLERIES_COLUMNS, uncut=["query_models"]) if rows else "no gallery"
    return f"store {out['store']}\n{body}{corrupt_lines(out)}"


# ---- versions --------------------------------------------------------------------------------


def versions(args) -> dict:
    from raycompat.store.catalog.models import Catalog
    from raycompat.store.read.listing import version_rows
    from raycompat.store.read.lookup import check_gallery

    store = open_store(args)
    check_gallery(store, args.gallery)  # an unknown name lists the galleries (exit 1)
    infos, corrupt = store.versions_report(args.gallery)
    grants, bad_grants = Catalog(store).grants_report(args.gallery)
    if not infos and not corrupt:
        raise StoreError(f"gallery {args.gallery!r} has no published version in {args.store}")
    rows = version_rows(infos, grants)
    out = {"gallery": args.gallery, "versions": rows, **_without_weights(store, rows)}
    return listing(out, corrupt + bad_grants)


def _without_weights(store, rows: list[dict]) -> dict:
    """``{"without_weights": [...]}``: the models of ``rows`` (writers and query models)
    registered without weights (adopted: they query with vectors only); ``{}`` when none."""
    from raycompat.store.catalog.models import Catalog

    named = {r["model_version"] for r in rows} | {m for r in rows for m in r["queried_by"]}
    without = sorted(named & set(Catalog(store).without_weights()))
    return {"without_weights": without} if without else {}


VERSIONS_COLUMNS = [
    ("version", "version"),
    ("model_version", "model"),
    ("rows", "rows"),
    ("width", "width"),
    ("dtype", "dtype"),
    ("lineage", "lineage"),
    ("queried_by", "query models"),
    ("created", "created"),
]


def render_versions(out: dict) -> str:
    rows = mark_no_weights(
        out["versions"], ["model_version", "queried_by"], out.get("without_weights", [])
    )
    body = table(rows, VERSIONS_COLUMNS)
    return f"gallery {out['gallery']}\n{body}{corrupt_lines(out)}"


def _versions_arguments(p) -> None:
    add_gallery(p)
    add_store_arguments(p)


# ---- models ----------------------------------------------------------------------------------


def models(args) -> dict:
    from raycompat.store.catalog.models import Catalog

    records, corrupt = Catalog(open_store(args)).models_report()
    rows = [{**vars(m), "weights": m.has_weights} for m in records]
    return listing({"models": rows}, corrupt)


MODELS_COLUMNS = [
    ("model_version", "model"),
    ("embed_dim", "dim"),
    ("method", "method"),
    ("parent", "parent"),
    ("created", "created"),
    ("uri", "files"),
]


def render_models(out: dict) -> str:
    """A model registered without weights (adopted) shows ``(no weights)`` as its files."""
    rows = [{**m, "uri": m["uri"] if m["weights"] else NO_WEIGHTS} for m in out["models"]]
    return table(rows, MODELS_COLUMNS) + corrupt_lines(out)


COMMANDS = (
    Command(
        "galleries",
        "every gallery of a store: its versions, the newest one's model and rows, and which "
        "version each query model searches",
        add_store_arguments,
        galleries,
        render_galleries,
        example=f"raycompat galleries --store {STORE}",
    ),
    Command(
        "versions",
        "a gallery's versions, lineage and query models",
        _versions_arguments,
        versions,
        render_versions,
        example=f"raycompat versions mnist --store {STORE}",
    ),
    Command(
        "models",
        "registered model versions",
        add_store_arguments,
        models,
        render_models,
        example=f"raycompat models --store {STORE} --json",
    ),
)
