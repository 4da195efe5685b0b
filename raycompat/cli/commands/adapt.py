"""``raycompat adapt GALLERY --version V --model M --pairs FILE``: a training-free upgrade on the
query side.

Fits a map from model M's embedding space into version V's (``--kind procrustes``, ``affine``
or ``adapter``; docs/transformations.md) on the pairs of FILE (M's embeddings of items V stores,
by ``id``), stores it and grants M the version through it (``serving/adapt.py``,
``serving/query_adapters.py``). From then on ``raycompat search G --model M`` maps M's queries
into V's space: nothing in the gallery is rewritten. The pairs are joined to V's rows in this
process (``--runner local``, the default: no Ray) or by Ray tasks over V's chunks (``--runner
ray``, on ``--address`` or a local Ray that ends with the command), each keeping only its
matches; torch for the fit.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from functools import partial

from raycompat.cli.arguments import RAY_ADDRESS_HELP, STORE, add_gallery, positive_int
from raycompat.cli.command import Command
from raycompat.cli.store_options import add_store_arguments, open_store


def adapt(args) -> dict | str:
    from raycompat.serving.adapt import adapt_queries

    store = open_store(args, gallery=args.gallery)
    with ExitStack() as ray_session:
        grant = adapt_queries(
            store, args.gallery, args.version, args.model, args.pairs,
            kind=args.kind, lam=args.lam, rows_of=_rows_of(args, ray_session),
        )  # fmt: skip
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


def _check(args) -> str | None:
    """A local ``--pairs`` that is not there is named as missing (pyarrow would call it "not a
    Parquet file"), before the store is opened; an s3:// URI is read by the handler."""
    if "://" not in args.pairs and not os.path.exists(args.pairs):
        return f"--pairs {args.pairs}: the file does not exist"
    return None


def _rows_of(args, ray_session: ExitStack):
    """How the pairs find V's rows: None (one scan here) or Ray tasks (``--runner ray``)."""
    if args.runner == "local":
        return None
    from raycompat.cluster.local_ray import ray_for_command
    from raycompat.cluster.pipelines.pairs import stored_matches

    ray_session.enter_context(ray_for_command(args.address))
    return partial(stored_matches, workers=args.workers)


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
    p.add_argument(
        "--runner",
        choices=("local", "ray"),
        default="local",
        help="join the pairs to the version's rows in this process (default) or in Ray tasks "
        "over its chunks (a large version)",
    )
    p.add_argument("--workers", type=positive_int, default=2, help="--runner ray: tasks at once")
    p.add_argument("--address", default=None, help=RAY_ADDRESS_HELP)
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
        check=_check,
    ),
)
