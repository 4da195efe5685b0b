"""``raycompat adopt | export``: a version from a Delta, Iceberg or Parquet table, and back.

``adopt`` publishes an existing table as a version, in place (no copy); its files are pinned
and validated by Ray tasks, after the cheap checks, on ``--address`` or a local Ray that ends
with the command, even a SIGKILLed one (``cluster/local_ray.py``); a rerun completes a killed
one without Ray. ``export`` writes a published version as a Delta or Iceberg table that
Spark, Trino, DuckDB and Ray Data read without raycompat (no Ray). The table formats are in
``raycompat/store/formats/``; docs/store.md describes both. An option of the other form
(``--catalog-uri`` without ``iceberg:<ns>.<table>``, an Iceberg option for Delta) exits 2.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext

from raycompat.cli.arguments import RAY_ADDRESS_HELP, STORE, add_gallery, as_of
from raycompat.cli.command import PROG, Command
from raycompat.cli.errors import error_line
from raycompat.cli.store_options import add_store_arguments, open_store, storage_options

# ---- adopt -----------------------------------------------------------------------------------


def adopt(args) -> dict:
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
    needs_ray = plan.published is None  # a rerun completes without Ray
    with ray_for_command(args.address) if needs_ray else nullcontext():
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


def render_adopt(out: dict) -> str:
    norm = "normalized" if out["normalized"] else "not normalized"
    return (
        f"adopted {out['uri']} as gallery {out['gallery']} version {out['version']}: "
        f"{out['rows']:,} rows in {out['files']} file(s), {out['width']}-d {out['dtype']}, "
        f"{norm}; model {out['model_version']} queries it"
    )


def _adopt_arguments(p) -> None:
    add_gallery(p, "the gallery to publish into (new or not)")
    p.add_argument(
        "uri",
        help="a Delta or Iceberg table, or a folder of *.parquet files (local or s3://); or "
        "iceberg:<namespace>.<table> in --catalog-uri",
    )
    add_store_arguments(p)
    p.add_argument("--version", required=True, help="the new version's name")
    p.add_argument(
        "--model",
        required=True,
        help="the embeddings' model; registered if new, and granted the version",
    )
    p.add_argument("--id-column", default="id", help="the table's id column (default id)")
    p.add_argument(
        "--embedding-column", default="embedding", help="its vector column (default embedding)"
    )
    p.add_argument(
        "--normalized",
        choices=["auto", "yes", "no"],
        default="auto",
        help="mark the version normalized: auto (iff every row is unit-norm), yes (required), no",
    )
    p.add_argument(
        "--as-of",
        type=as_of,
        default=None,
        help="a Delta version or Iceberg snapshot id, or an ISO timestamp (default: current)",
    )
    p.add_argument(
        "--catalog-uri",
        default=None,
        help="for URI iceberg:<namespace>.<table>: the SQL catalog (sqlite:///path/catalog.db)",
    )
    p.add_argument("--warehouse", default=None, help="the catalog's warehouse (optional)")
    p.add_argument("--address", default=None, help=RAY_ADDRESS_HELP)


# ---- export ----------------------------------------------------------------------------------


def export(args) -> dict | str:
    """One summary line, or the summary as JSON with ``--json``."""
    from raycompat.io.uri import split_uri
    from raycompat.store.formats import ExportOptionError, export_version
    from raycompat.store.read.lookup import version_record

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


def _export_arguments(p) -> None:
    add_gallery(p)
    p.add_argument(
        "target", help="Delta: a folder or s3:// URI; Iceberg: namespace.table in --catalog-uri"
    )
    add_store_arguments(p)
    p.add_argument("--version", required=True, help="the published version to export")
    p.add_argument(
        "--format", required=True, choices=["delta", "iceberg"], help="the table format to write"
    )
    p.add_argument(
        "--mode",
        choices=["error", "overwrite"],
        default=None,
        help="Delta: overwrite replaces an existing Delta table's rows (default: refuse it)",
    )
    p.add_argument("--catalog-uri", help="Iceberg: the SQL catalog, e.g. sqlite:///catalog.db")
    p.add_argument("--warehouse", help="Iceberg: where its tables live (a folder or s3:// URI)")


COMMANDS = (
    Command(
        "adopt",
        "publish an existing table (Delta, Iceberg or a Parquet folder; local or s3://) as "
        "a version, in place (no copy); its files are pinned and validated on Ray",
        _adopt_arguments,
        adopt,
        render_adopt,
        example="raycompat adopt faces s3://bucket/tables/faces --store s3://bucket/store "
        "--version v1 --model m1",
        resumes="nothing is published before its checks pass; rerunning the same command "
        "completes the adoption",
    ),
    Command(
        "export",
        "write a version as a Delta or Iceberg table that Spark, Trino, DuckDB and Ray "
        "Data read without raycompat (float16 is widened to float32)",
        _export_arguments,
        export,
        example=f"raycompat export mnist /tmp/mnist_v1 --store {STORE} --version v1 --format delta",
        resumes="a table this export created is removed; rerunning the same command exports "
        "again (with --mode overwrite over a Delta table that was there before)",
    ),
)
