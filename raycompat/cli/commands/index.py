"""``raycompat index build|verify``: make a version's faiss index, and check one.

    raycompat index build GALLERY --version V --store ROOT [--kind auto|flat|ivfpq|sharded_ivf]
                          [--queries N] [--force]
    raycompat index verify GALLERY --version V --store ROOT [--queries N]

``build`` is the one CLI command that writes an index (``raycompat search`` only reads, docs/
store.md "Index per version"): it builds and publishes the version's index with
:func:`raycompat.index.version_index.build_version_index`. ``flat`` and ``ivfpq`` are built in
this process; ``sharded_ivf`` (``auto`` above 100 000 rows) runs its tasks on Ray
(:class:`raycompat.cluster.pipelines.index.RayTasks`, ``--address``), or in this process with
``--runner local``. Before publishing, ``build`` measures the new index's recall@10 against
exact search on ``--queries`` (1000) sampled stored rows, records it in the index's pointer and
prints it; it refuses (exit 1, nothing replaced) to replace a published index of higher recall
unless ``--force`` (:mod:`raycompat.index.measured_build`). ``verify`` loads the published
index with every file's size and sha256 checked (``verify="full"``) and estimates recall@10
against exact search on ``--queries`` sampled stored rows (:mod:`raycompat.index.recall`); a
missing or corrupt index is an error, exit 1. Each prints one line, or a JSON object with
``--json``.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from raycompat.cli.arguments import (
    RAY_ADDRESS_HELP,
    STORE,
    add_gallery,
    positive_int,
)
from raycompat.cli.command import Command, command_group
from raycompat.cli.store_options import add_store_arguments, open_store
from raycompat.errors import RaycompatError, UsageError

KINDS = ("auto", "flat", "ivfpq", "sharded_ivf")


class IndexOptionsError(UsageError, ValueError):
    """``index build``'s options do not fit the version (an ``--nlist`` above what its rows can
    train, an ``m`` that does not divide the width...): the builder's own message, exit 2."""


# ---- build -----------------------------------------------------------------------------------


def build(args) -> dict | str:
    """Build and publish the index (Ray only for a ``sharded_ivf`` build with ``--runner ray``)."""
    from raycompat.index.ivf import SHARDED_IVF
    from raycompat.index.measured_build import build_measured_index
    from raycompat.index.version_index import resolve_kind
    from raycompat.store.read.lookup import version_record

    store = open_store(args)
    info = version_record(store, args.gallery, args.version)  # unknown names list the known
    kind = resolve_kind(info, args.kind)
    options = {k: getattr(args, k) for k in ("nlist", "nprobe") if getattr(args, k) is not None}
    with ExitStack() as ray_session:  # a local Ray ends with the command (cluster/local_ray.py)
        if kind == SHARDED_IVF:
            options["runner"] = _runner(args, ray_session)
        try:
            built = build_measured_index(
                store,
                args.gallery,
                args.version,
                force=args.force,
                queries=args.queries,
                kind=kind,
                **options,
            )
        except ValueError as error:
            if isinstance(error, RaycompatError):  # a store or data error keeps its own status
                raise
            raise IndexOptionsError(f"{args.gallery}/{args.version}: {error}") from None
    return _build_report(args, kind, info.rows, built)


def _build_report(args, kind: str, rows: int, built) -> dict | str:
    """``index build``'s answer: one line, or a JSON object with ``--json``."""
    recall = built.recall
    if args.json:
        return {
            "gallery": args.gallery,
            "version": args.version,
            "kind": kind,
            "uri": built.uri,
            "recall": recall["recall"],
            "k": recall["k"],
            "queries": recall["queries"],
            "replaced_recall": built.previous,
        }
    replaced = "" if built.previous is None else f", replacing one of {built.previous:.4f}"
    return (
        f"indexed {args.gallery}/{args.version}: {kind} over {rows} rows, recall@"
        f"{recall['k']} {recall['recall']:.4f} against exact search on {recall['queries']} "
        f"sampled rows{replaced}, at {built.uri}"
    )


def _runner(args, ray_session: ExitStack):
    if args.runner == "local":
        from raycompat.index.tasks import LocalTasks

        return LocalTasks()
    from raycompat.cluster.local_ray import ray_for_command
    from raycompat.cluster.pipelines.index import RayTasks

    ray_session.enter_context(ray_for_command(args.address))
    return RayTasks(workers=args.workers)


def _build_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument(
        "--kind",
        choices=KINDS,
        default="auto",
        help="auto (flat up to 100 000 rows, sharded_ivf above), flat (exact), ivfpq, or "
        "sharded_ivf (built in shards, searched from disk)",
    )
    p.add_argument(
        "--nlist", type=positive_int, help="IVF kinds: inverted lists (default: by rows)"
    )
    p.add_argument(
        "--nprobe", type=positive_int, help="IVF kinds: lists a search visits by default"
    )
    p.add_argument(
        "--runner",
        choices=("ray", "local"),
        default="ray",
        help="sharded_ivf: run its tasks on Ray (default) or in this process",
    )
    p.add_argument(
        "--workers", type=positive_int, default=2, help="sharded_ivf on Ray: tasks at once"
    )
    p.add_argument("--address", default=None, help=RAY_ADDRESS_HELP)
    p.add_argument(
        "--queries",
        type=positive_int,
        default=1000,
        help="stored rows sampled as queries to measure the new index's recall@10 (default 1000)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the published index even if it measures a higher recall@10",
    )


# ---- verify ----------------------------------------------------------------------------------


def verify(args) -> dict | str:
    """Checksums (every file, sha256) and a recall@10 estimate; a missing or corrupt index
    raises (``MissingIndexError``, ``CorruptIndexError``: exit 1)."""
    from raycompat.index.recall import estimate_recall
    from raycompat.index.stdout import stdout_to_stderr
    from raycompat.index.version_index import load_version_index
    from raycompat.store.read.lookup import version_record

    store = open_store(args)
    version_record(store, args.gallery, args.version)  # unknown names list the known (exit 2)
    with stdout_to_stderr():
        index = load_version_index(store, args.gallery, args.version, use_gpu=False, verify="full")
        recall = estimate_recall(store, args.gallery, index, queries=args.queries, seed=args.seed)
    out = {
        "gallery": args.gallery,
        "version": args.version,
        "kind": index.index.kind,
        "rows": index.info.rows,
        "checksums": "ok",
        **recall,  # recall (at k), k, queries
    }
    if args.json:
        return out
    return (
        f"{args.gallery}/{args.version}: {out['kind']} index of {out['rows']} rows, checksums ok; "
        f"recall@{recall['k']} {recall['recall']:.4f} against exact search on "
        f"{recall['queries']} sampled rows"
    )


def _verify_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument(
        "--queries",
        type=positive_int,
        default=100,
        help="stored rows sampled as queries for the recall@10 estimate (default 100)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the query sample (default 0)")


# ---- the `index` command: its actions --------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    add_gallery(p)
    p.add_argument("--version", required=True, help="the published version of the gallery")
    add_store_arguments(p)
    p.add_argument("--json", action="store_true", help="JSON instead of one line")


ACTIONS = (
    Command(
        "build",
        "build and publish the version's index (the only command that writes one)",
        _build_arguments,
        build,
        example=f"raycompat index build mnist --version v1 --store {STORE} --kind flat",
    ),
    Command(
        "verify",
        "check the published index's checksums and estimate its recall@10 against exact search",
        _verify_arguments,
        verify,
        example=f"raycompat index verify mnist --version v1 --store {STORE} --queries 200",
    ),
)
COMMANDS = (
    command_group(
        "index",
        "build a version's faiss index, or verify one (checksums, recall@10)",
        ACTIONS,
        description="build or verify a version's faiss index (docs/store.md, Index per version)",
        resumes="an index is published only once built and measured; rerunning the same "
        "command builds it again, keeping the shards a sharded_ivf build finished",
    ),
)
