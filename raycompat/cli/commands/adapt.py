"""``raycompat adapt GALLERY --version V --model M --pairs FILE``: a training-free upgrade on the
query side.

Fits a map from model M's embedding space into version V's (``--kind procrustes``, ``affine``
or ``adapter``; docs/transformations.md) on the pairs of FILE (M's embeddings of items V stores,
by ``id``), stores it and grants M the version through it (``index/adapt.py``,
``store/query_adapters.py``). From then on ``raycompat search G --model M`` maps M's queries
into V's space: nothing in the gallery is rewritten. No Ray; torch for the fit.
"""

from __future__ import annotations

from raycompat.cli.arguments import STORE, add_gallery
from raycompat.cli.command import Command
from raycompat.cli.store_options import add_store_arguments, open_store


def adapt(args) -> dict | str:
    from raycompat.index.adapt import adapt_queries

    store = open_store(args, gallery=args.gallery)
    grant = adapt_queries(
        store, args.gallery, args.version, args.model, args.pairs, kind=args.kind, lam=args.lam
    )
    evidence = grant.evidence
    if args.json:
        return {"gallery": args.gallery, "version": args.version, "model": args.model, **evidence}
    relative = evidence["relative_residual"]
    residual = "" if relative is None else f", relative residual {relative:.4f}"
    return (
        f"{args.model} searches {args.gallery}/{args.version} through a {evidence['kind']} "
        f"query adapter fitted on {evidence['pairs']} pairs{residual} "
        f"({store.uri(args.gallery, evidence['adapter'])})"
    )


def _arguments(p) -> None:
    from raycompat.transformations.kinds import FITTED_KINDS

    add_gallery(p)
    p.add_argument("--version", required=True, help="the gallery version the queries search")
    p.add_argument("--model", required=True, help="the registered model whose queries are mapped")
    p.add_argument(
        "--pairs",
        required=True,
        help="Parquet file of id and embedding: the model's embeddings of items the version stores",
    )
    p.add_argument(
        "--kind", choices=FITTED_KINDS, default="procrustes", help="the map (default procrustes)"
    )
    p.add_argument(
        "--lam", type=float, default=0.0, help="affine: the orthogonality penalty (default 0)"
    )
    add_store_arguments(p)
    p.add_argument("--json", action="store_true", help="JSON instead of one line")


COMMANDS = (
    Command(
        "adapt",
        "upgrade without retraining: fit a map from a model's queries into a version's space on "
        "paired embeddings, and let the model search the version through it",
        _arguments,
        adapt,
        example="raycompat adapt mnist --version v1 --model m2 --pairs m2_sample.parquet "
        f"--store {STORE}",
        as_json=False,
    ),
)
