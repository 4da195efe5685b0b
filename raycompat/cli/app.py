"""``raycompat``: inspect a store's galleries and models, and search with any registered model.

    raycompat --version                           the installed version
    raycompat galleries --store ROOT              every gallery: versions, the newest one's
                                                  model and rows, and which version each
                                                  query model searches
    raycompat versions <gallery> --store ROOT     versions, their model, rows, width, dtype,
                                                  lineage, and which models may query each
    raycompat models --store ROOT                 registered model versions
    raycompat search --store ROOT --gallery G --model M IMAGE [IMAGE ...] [-k 5]
    raycompat search ... --vectors Q.npy|Q.parquet   query vectors of model M
    raycompat search ... --ids ID [ID ...]        query with rows stored in M's gallery version
    raycompat search ... --nprobe N               inverted lists an IVF index visits per query
    raycompat gc --store ROOT [--older-than 8d] [--keep-versions K] [--dry-run]
                                                  only in a marked store; --dry-run also
                                                  says what it keeps and why
    raycompat mark-store --store ROOT [--force]   mark a store written before markers
    raycompat report RUN_DIR [--json]             an upgrade run's report (report.md, or the
                                                  decisions and matrix as JSON)
    raycompat adopt URI --store ROOT --gallery G --version V --model M
        [--id-column C] [--embedding-column C]    publish an existing Parquet table (folder or
                                                  s3:// prefix) as a version, in place; Ray
                                                  validates it (docs/store.md); a rerun
                                                  completes a killed one
    raycompat adopt iceberg:NS.TABLE --catalog-uri sqlite:///catalog.db [--warehouse W] ...
                                                  an Iceberg table named in a SQL catalog
    raycompat history <gallery> --store ROOT      versions and who wrote them, every decision
                                                  (refused, failed) with its reason, grants,
                                                  what each model serves, alias changes
    raycompat promote <gallery> --model M --version V --store ROOT
                                                  M serves version V from now on (an alias;
                                                  the previous one is kept for rollback)
    raycompat rollback <gallery> --model M --store ROOT
                                                  M serves again what it served before
    raycompat revoke <gallery> --model M --store ROOT
                                                  M serves nothing on the gallery
    raycompat retire M --store ROOT [--reason R]  M serves no gallery, takes no new grant
    raycompat index build G --version V --store ROOT [--kind auto|flat|ivfpq|sharded_ivf]
                                                  build and publish a version's faiss index
    raycompat index verify G --version V --store ROOT [--queries N]
                                                  its checksums and recall@10 against exact
                                                  search (cli/index_commands.py)
    raycompat export TARGET --store ROOT --gallery G --version V --format delta|iceberg
        [--mode overwrite] [--catalog-uri URL --warehouse DIR]
                                                  write a version as a Delta table (TARGET a
                                                  folder or s3:// URI) or an Iceberg table
                                                  (TARGET namespace.table); float16 -> float32

Every command that reads or writes a store takes the jobs' S3 options (``cli/arguments.py``,
``add_store_arguments``): ``--endpoint-url URL`` (default ``AWS_ENDPOINT_URL_S3``, else
``AWS_ENDPOINT_URL``), ``--profile NAME`` and ``--storage-options JSON`` (more s3fs
``storage_options``; credentials in it are scrubbed from every line printed); a local
``--store`` ignores them.

Every subcommand's ``--help`` describes each option and ends with an example command. A
gallery, model or version that does not exist is a usage error (exit 2) listing those that do
and the nearest name (``store/lookup.py``); a missing report folder lists the runs beside it.

Listings print aligned tables (``cli_tables.py``); ``--json`` prints the same data as JSON for
scripts. ``search`` prints id, score and the stored label of each hit: only items found, so a
query gets fewer than ``-k`` where the version holds fewer rows or an IVF index's probed lists
hold fewer (a note on stderr says so; ``--nprobe`` visits more). stdout carries only the
listing: faiss's own printing goes to stderr, and ``--json`` is always valid JSON.

``search`` embeds the images with model M (or takes ``--vectors`` / ``--ids``), finds the
gallery version M serves (its newest alias, else its catalog grant: extracted, compatible or
transformed; a model revoked there or retired is refused, ``store/aliases.py``), and searches
that version's published faiss index (``raycompat index build`` makes one; without a valid one
a version of up to 100 000 rows is searched exactly in memory, a note on stderr says so, and a
larger one is refused, naming ``index build``: read commands never write to the store). A
compatible model of another width is compared on the shared first coordinates (BCT:
zero-padding), as in training. No Ray: the query path is the core's (``index/query.py``,
``search_gallery``); this command parses, prints notes on stderr and renders.

A corrupt record does not hide the others: ``versions`` and ``models`` list the readable ones,
name each corrupt one (file and error) and exit 1. Errors are one line (``cli/errors.py``), with
the exit status of their type (``raycompat/errors.py``): 2 for a usage error (no store at
``--store``; a gallery, model or version that does not exist; a ``-k`` below 1, an unreadable,
empty or malformed query file: :class:`~raycompat.index.query.QueryError`), 1 for a store or
data error; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from raycompat.cli import index_commands, serving
from raycompat.cli.arguments import build_parser, storage_options
from raycompat.cli.errors import debug_requested, error_line
from raycompat.cli.tables import RENDERERS
from raycompat.errors import RaycompatError, exit_status
from raycompat.index.query import check_k, query_vectors, search_gallery, served_version
from raycompat.io.credentials import configure_logging
from raycompat.io.uri import split_uri
from raycompat.store import GalleryStore
from raycompat.store.errors import StoreError
from raycompat.store.listing import version_rows
from raycompat.store.lookup import check_gallery, choices, version_record
from raycompat.store.model_catalog import Catalog

# Imports stay light: torch, Ray and faiss load inside the handlers that use them, so --help,
# versions and search --vectors/--ids start without torch or Ray (tests/cli/test_startup.py).


def open_store(args: argparse.Namespace, *, must_exist: bool = True) -> GalleryStore:
    """The store at ``--store``, reached with the command line's S3 options
    (:func:`~raycompat.cli.arguments.storage_options`; every store command opens its store
    here). A mistyped root is a MissingStoreError (exit 2), not an empty listing, unless
    ``must_exist`` is False (a writer creates the store with its first record)."""
    store = GalleryStore(args.store, storage_options(args, args.store))
    if must_exist:
        store.check_exists()
    return store


def _listing(out: dict, corrupt: list[tuple[str, str]]) -> dict:
    """``out`` with the unreadable records it skipped, each with its file and error."""
    if corrupt:
        out["corrupt"] = [{"file": uri, "error": error} for uri, error in corrupt]
    return out


def galleries(args) -> dict:
    """Every gallery of the store with its version count, newest version (model, rows) and the
    version each query model searches (``store/listing.py``)."""
    from raycompat.store.listing import gallery_summaries

    store = open_store(args)
    rows, corrupt = gallery_summaries(store)
    return _listing({"store": store.uri(), "galleries": rows}, corrupt)


def versions(args) -> dict:
    store = open_store(args)
    check_gallery(store, args.gallery)  # an unknown name lists the galleries (exit 1)
    infos, corrupt = store.versions_report(args.gallery)
    grants, bad_grants = Catalog(store).grants_report(args.gallery)
    if not infos and not corrupt:
        raise StoreError(f"gallery {args.gallery!r} has no published version in {args.store}")
    out = {"gallery": args.gallery, "versions": version_rows(infos, grants)}
    return _listing(out, corrupt + bad_grants)


def models(args) -> dict:
    records, corrupt = Catalog(open_store(args)).models_report()
    return _listing({"models": [vars(m) for m in records]}, corrupt)


def search(args) -> dict:
    """Top-k hits per query (only items found; see the module docstring). faiss prints from
    C++ to the process's stdout while it loads an index: sent to stderr here."""
    check_k(args.k)
    from raycompat.index.stdout import stdout_to_stderr  # faiss: only this command loads it

    with stdout_to_stderr():
        return _search(args)


def _search(args) -> dict:
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


def report(args) -> dict | str:
    directory = Path(args.run)
    name = "report.json" if args.json else "report.md"
    path = directory / name
    if not path.is_file():
        runs = _report_runs(directory.parent)
        known = f"; {choices(directory.name, runs, f'runs in {directory.parent}')}"
        raise FileNotFoundError(
            f"{path} does not exist: give the report directory of an upgrade run "
            f"(<report_dir>/<name>/, written by jobs/upgrade.py){known if runs else ''}"
        )
    text = path.read_text()
    return json.loads(text) if args.json else text


def _report_runs(folder: Path) -> list[str]:
    """The run folders (holding a report.md) in ``folder``, sorted; none if it is no folder."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / "report.md").is_file())


PROG = "raycompat"


def gc(args) -> dict:
    """List (``--dry-run``) or delete what ``raycompat.store.gc`` finds, and what it keeps and
    why; refuses an unmarked folder (exit 2); see docs/store.md."""
    from raycompat.store.gc import collect, make_plan

    store = open_store(args)
    plan = make_plan(store, older_than_s=args.older_than, keep_versions=args.keep_versions)
    items = plan.items
    freed = 0 if args.dry_run else collect(store, items)
    return {
        "store": args.store,
        "dry_run": args.dry_run,
        "items": [
            {"kind": i.kind, "uri": i.uri, "reason": i.reason, "bytes": i.bytes} for i in items
        ],
        "kept": [{"kind": k.kind, "what": k.what, "reason": k.reason} for k in plan.kept],
        "bytes": sum(i.bytes for i in items),
        "bytes_freed": freed,
    }


def mark_store(args) -> str:
    """Mark ``--store`` as a raycompat store, so gc may manage it (``store/marker.py``).
    Refuses a folder holding no version record and no model catalog unless ``--force``."""
    from raycompat.store.errors import MissingStoreError
    from raycompat.store.marker import (
        MARKER_NAME,
        galleries_with_records,
        read_marker,
        register_gallery,
        store_contents,
    )

    store = open_store(args, must_exist=False)
    uri = store.uri()
    marker = read_marker(store.backend)
    if marker is None:
        found = store_contents(store.backend)
        if not found and not args.force:
            raise MissingStoreError(
                f"{uri} holds no gallery record (*/_versions/*.json) and no model catalog "
                f"(_models/*.json), so it does not look like a store; not marked (--force "
                f"marks it)"
            )
        store.mark()
    # galleries written before gallery records existed: gc manages only registered ones
    added = [g for g in galleries_with_records(store.backend) if register_gallery(store.backend, g)]
    registered = f"; registered galleries: {', '.join(added)}" if added else ""
    if marker is not None:
        return f"{uri} is already marked ({marker.format}, created {marker.created}){registered}"
    return (
        f"marked {uri} as a raycompat store ({MARKER_NAME}): {', '.join(found) or 'empty'}"
        f"{registered}"
    )


def adopt(args) -> dict:
    """Publish the table at ``args.uri`` (a Delta or Iceberg snapshot, or a Parquet folder) as
    a version, in place; the files are validated by Ray tasks, after the cheap checks, on
    ``--address`` or a local Ray that ends with the command, even a SIGKILLed one
    (``cluster/local_ray.py``)."""
    from raycompat.cluster.local_ray import ray_for_command
    from raycompat.cluster.pipelines.adopt import run_adoption
    from raycompat.store.formats import AdoptOptionError, plan_adoption

    store = open_store(args, must_exist=False)  # a writer: its first record creates a store
    try:
        plan = plan_adoption(
            store,
            args.gallery,
            args.version,
            args.uri,
            model=args.model,
            id_column=args.id_column,
            embedding_column=args.embedding_column,
            as_of=args.as_of,
            catalog_uri=args.catalog_uri,
            warehouse=args.warehouse,
        )
    except AdoptOptionError as error:  # --catalog-uri without iceberg:<ns>.<table>, or the reverse
        print(error_line(PROG, error), file=sys.stderr)
        raise SystemExit(2) from None
    normalized = {"auto": None, "yes": True, "no": False}[args.normalized]
    ray_options = {"include_dashboard": False, "log_to_driver": False}
    needs_ray = plan.published is None  # a rerun completes without Ray
    with ray_for_command(args.address, **ray_options) if needs_ray else nullcontext():
        info = run_adoption(store, plan, normalized=normalized)
    return {
        "gallery": args.gallery,
        "version": info.version,
        "model_version": info.model_version,
        "uri": plan.source,  # delta:<root>@<version> for a table snapshot
        "root": info.external["root"],
        "table": info.external.get("table"),
        "files": len(info.files),
        "rows": info.rows,
        "width": info.width,
        "dtype": info.dtype,
        "normalized": info.normalized,
        "ids": info.ids,
    }


def history(args) -> dict:
    """A gallery's versions (who wrote each), every decision with its reason, its query
    grants (``store/history.py``), what each model serves and every alias change
    (``store/serving.py``); reads the store, never writes it. An unknown gallery is a
    usage error listing the galleries that exist."""
    from raycompat.store.history import gallery_history
    from raycompat.store.serving import with_serving

    store = open_store(args)
    return with_serving(store, args.gallery, gallery_history(store, args.gallery))


def export(args) -> dict | str:
    """Write a published version as a Delta or Iceberg table (no Ray): one summary line, or
    the summary as JSON with ``--json``; an option of the other format exits 2."""
    from raycompat.store.formats import ExportOptionError, export_version

    options = {"mode": args.mode, "catalog_uri": args.catalog_uri, "warehouse": args.warehouse}
    store = open_store(args)
    version_record(store, args.gallery, args.version)  # unknown names: those that exist, exit 1
    written = args.target if args.format == "delta" else args.warehouse  # where files go
    if written is not None and split_uri(written)[0] == "s3":  # from a local store too
        options["storage_options"] = storage_options(args, written)  # else export_version's
    try:
        summary = export_version(
            store, args.gallery, args.version, args.format, args.target, **options
        )
    except ExportOptionError as error:
        print(error_line(PROG, error), file=sys.stderr)
        raise SystemExit(2) from None
    return summary.to_dict() if args.json else summary.line()


COMMANDS = {
    "galleries": galleries,
    "versions": versions,
    "models": models,
    "search": search,
    "report": report,
    "gc": gc,
    "mark-store": mark_store,
    "adopt": adopt,
    "export": export,
    "history": history,
    "promote": serving.promote,
    "rollback": serving.rollback,
    "revoke": serving.revoke,
    "retire": serving.retire,
    "index": index_commands.index,
}


def parser() -> argparse.ArgumentParser:
    """The global flags and one subparser per subcommand (``raycompat.cli.arguments``)."""
    return build_parser(PROG, __doc__.splitlines()[0])


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0, 1 for a data error (a corrupt record among those listed, a grant that
    is missing; any :class:`~raycompat.errors.DataError`) or a missing file, 2 for a usage
    error (no store at ``--store``, an unknown gallery, model or version, a
    :class:`~raycompat.index.query.QueryError`;
    any :class:`~raycompat.errors.UsageError`)."""
    configure_logging("%(name)s: %(message)s", stream=sys.stderr)  # log lines scrubbed
    args = parser().parse_args(argv)
    if getattr(args, "verbose", False):
        logging.getLogger("raycompat").setLevel(logging.DEBUG)
    debug = getattr(args, "debug", False) or debug_requested()
    if args.command == "search" and sum(map(bool, (args.images, args.vectors, args.ids))) != 1:
        print(
            error_line(PROG, "search takes images, --vectors or --ids (one of them)"),
            file=sys.stderr,
        )
        return 2
    if getattr(args, "images", None):
        missing = [p for p in args.images if not Path(p).is_file()]
        if missing:
            print(
                error_line(PROG, f"query image(s) not found: {', '.join(missing)}"), file=sys.stderr
            )
            return 2
    try:
        out = COMMANDS[args.command](args)
    except (RaycompatError, FileNotFoundError) as err:  # and a missing report.md: exit 1
        if debug:
            raise
        print(error_line(PROG, err), file=sys.stderr)
        return exit_status(err)
    except OSError as err:  # storage unreachable, refused or denied: the user's to fix
        if debug:
            raise
        hint = "check --store, --endpoint-url and the credentials; --debug shows the traceback"
        print(
            error_line(PROG, f"storage error: {' '.join(str(err).split())} ({hint})"),
            file=sys.stderr,
        )
        return 1
    if isinstance(out, str):
        print(out)
    elif getattr(args, "json", False) or args.command not in RENDERERS:
        print(json.dumps(out, indent=2, default=str))
    else:
        print(RENDERERS[args.command](out))
    corrupt = out.get("corrupt", []) if isinstance(out, dict) else []
    for record in corrupt:  # listed on stdout too; stderr says the listing is incomplete
        print(error_line(PROG, f"corrupt record skipped: {record['error']}"), file=sys.stderr)
    return 1 if corrupt else 0


if __name__ == "__main__":
    sys.exit(main())
