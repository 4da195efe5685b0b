"""``raycompat``: inspect a store's galleries and models, and search with any registered model.

    raycompat versions <gallery> --store ROOT     versions, their model, rows, width, dtype,
                                                  lineage, and which models may query each
    raycompat models --store ROOT                 registered model versions
    raycompat search --store ROOT --gallery G --model M IMAGE [IMAGE ...] [-k 5]
    raycompat search ... --vectors Q.npy|Q.parquet   query vectors of model M
    raycompat search ... --ids ID [ID ...]        query with rows stored in M's gallery version
    raycompat search ... --nprobe N               inverted lists an IVF index visits per query
    raycompat gc --store ROOT [--older-than 24h] [--keep-versions K] [--dry-run]
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
                                                  (refused, failed) with its reason, grants
    raycompat export TARGET --store ROOT --gallery G --version V --format delta|iceberg
        [--mode overwrite] [--catalog-uri URL --warehouse DIR]
                                                  write a version as a Delta table (TARGET a
                                                  folder or s3:// URI) or an Iceberg table
                                                  (TARGET namespace.table); float16 -> float32

Listings print aligned tables (``cli_tables.py``); ``--json`` prints the same data as JSON for
scripts. ``search`` prints id, score and the stored label of each hit: only items found, so a
query gets fewer than ``-k`` where the version holds fewer rows or an IVF index's probed lists
hold fewer (a note on stderr says so; ``--nprobe`` visits more). stdout carries only the
listing: faiss's own printing goes to stderr, and ``--json`` is always valid JSON.

``search`` embeds the images with model M (or takes ``--vectors`` / ``--ids``), finds the
gallery version M may query (its catalog grant: extracted, compatible or transformed), and
searches that version's faiss index (built on first use, rebuilt when it fails its checksums).
A compatible model of another width is compared on the shared first coordinates (BCT:
zero-padding), as in training. No Ray: this is the core.

A corrupt record does not hide the others: ``versions`` and ``models`` list the readable ones,
name each corrupt one (file and error) and exit 1. Errors are one line (``cli_errors.py``): exit
2 for a usage error (no store at ``--store``; a ``-k`` below 1, an unreadable, empty or malformed
query file: :class:`QueryError`), 1 for a store or data error; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

from raycompat.cli.errors import DEBUG_ENV, DEBUG_FLAG, USAGE_ERRORS, debug_requested, error_line
from raycompat.cli.tables import RENDERERS
from raycompat.index.distances import ZeroNormError
from raycompat.io.credentials import configure_logging
from raycompat.store import GalleryStore, VersionInfo
from raycompat.store.errors import StoreError
from raycompat.store.gc import GcArgumentError
from raycompat.store.lease import DEFAULT_TIMEOUT_S
from raycompat.store.model_catalog import Catalog, QueryGrant

# Imports stay light: torch, Ray and faiss load inside the handlers that use them, so --help,
# versions and search --vectors/--ids start without torch or Ray (tests/cli/test_startup.py).


def gallery_versions(store: GalleryStore, gallery: str) -> list[dict]:
    """Every published version of ``gallery``: model, width, rows, lineage and query models.
    A corrupt version record or grant raises (see ``versions`` for the lenient listing)."""
    return _version_rows(store.versions(gallery), Catalog(store).grants(gallery))


def _version_rows(infos: list[VersionInfo], grants: list[QueryGrant]) -> list[dict]:
    rows = []
    for info in infos:
        queried_by = [g.model_version for g in grants if g.gallery_version == info.version]
        rows.append(
            {
                "version": info.version,
                "model_version": info.model_version,
                "width": info.width,
                "dtype": info.dtype,
                "rows": info.rows,
                "lineage": info.lineage,
                "created": info.created,
                "queried_by": queried_by,
            }
        )
    return rows


class QueryError(ValueError):
    """What ``search`` was asked is unusable: ``-k`` below 1, or a query file that is
    unreadable, empty or malformed (the message names the file). Exit status 2."""


def open_store(root: str) -> GalleryStore:
    """The store at ``root`` for reading: a mistyped root is a MissingStoreError (exit 2),
    not an empty listing."""
    store = GalleryStore(root)
    store.check_exists()
    return store


def _listing(out: dict, corrupt: list[tuple[str, str]]) -> dict:
    """``out`` with the unreadable records it skipped, each with its file and error."""
    if corrupt:
        out["corrupt"] = [{"file": uri, "error": error} for uri, error in corrupt]
    return out


def versions(args) -> dict:
    store = open_store(args.store)
    infos, corrupt = store.versions_report(args.gallery)
    grants, bad_grants = Catalog(store).grants_report(args.gallery)
    if not infos and not corrupt:
        raise StoreError(f"gallery {args.gallery!r} has no published version in {args.store}")
    out = {"gallery": args.gallery, "versions": _version_rows(infos, grants)}
    return _listing(out, corrupt + bad_grants)


def models(args) -> dict:
    records, corrupt = Catalog(open_store(args.store)).models_report()
    return _listing({"models": [vars(m) for m in records]}, corrupt)


def embed_images(model_uri: str, paths: list[str]) -> np.ndarray:
    import torch

    from raycompat.data.image_folder import read_image
    from raycompat.train.export import load_exported_model

    model, _ = load_exported_model(model_uri)
    # Backbones record the input they were built for; others take RGB at the stored size.
    channels = getattr(model.backbone, "in_chans", 3)
    size = getattr(model.backbone, "image_size", None)
    hw = (size, size) if isinstance(size, int) else size
    images = torch.stack(
        [read_image(p, mode="L" if channels == 1 else "RGB", size=hw) for p in paths]
    )
    with torch.no_grad():
        return model.forward_features(images).numpy()


def query_vectors(args, store: GalleryStore, catalog: Catalog, version: str) -> np.ndarray:
    """``(Q, d)`` queries from ``--vectors`` (.npy or Parquet ``embedding``), ``--ids`` (rows
    stored in the version the model queries) or images embedded with the model."""
    if args.vectors:
        return read_query_vectors(args.vectors, catalog.model(args.model).embed_dim)
    if args.ids:
        return stored_vectors(store, args.gallery, version, args.ids)
    record = catalog.model(args.model)
    if Path(record.uri).is_dir():
        return embed_images(record.uri, args.images)
    with tempfile.TemporaryDirectory() as local:  # files in an S3 store: copy them out first
        return embed_images(catalog.fetch_model_files(args.model, local), args.images)


def read_query_vectors(path: str, width: int) -> np.ndarray:
    """A ``(Q, width)`` float array, ``Q >= 1``, from ``.npy`` or a Parquet ``embedding`` column.

    Raises:
        QueryError: the file is unreadable, or :func:`query_problem` finds it malformed.
    """
    try:
        if path.endswith(".npy"):
            x = np.load(path, allow_pickle=False)
        else:
            import pyarrow.parquet as pq

            from raycompat.store.vectors import vectors

            x = vectors(pq.read_table(path, columns=["embedding"]), "embedding")
    except (OSError, KeyError, ValueError, EOFError, AttributeError, TypeError) as error:
        npy = path.endswith(".npy")
        what = "not a readable .npy array" if npy else "no readable fixed-size list 'embedding'"
        raise QueryError(f"{path}: {what} ({error})") from None
    problem = query_problem(x, width)
    if problem:
        raise QueryError(
            f"{path}: expected finite vectors of shape (Q, {width}) for model width {width}, "
            f"got {problem}"
        )
    return x.astype(np.float32)


def query_problem(x: np.ndarray, width: int) -> str | None:
    """What makes ``x`` unusable as ``(Q >= 1, width)`` finite query vectors, or None."""
    if x.dtype.kind not in "fiu":
        return f"values of type {x.dtype}"
    if x.ndim >= 1 and x.shape[0] == 0:
        return f"no rows (shape {x.shape})"
    if x.ndim != 2 or x.shape[1] != width:
        return f"shape {x.shape}"
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        return f"NaN or inf in row {int(np.argmin(finite))}"
    return None


def _stored_rows(store: GalleryStore, gallery: str, version: str, ids: list, columns: list):
    """``(id -> row, table)`` of the rows of ``ids`` in the version (one streamed scan; only
    the matches are kept)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    found, want = [], None
    for batch in store.iter_batches(gallery, version, columns=["id", *columns]):
        want = want if want is not None else pa.array(ids).cast(batch.schema.field("id").type)
        found.append(batch.filter(pc.is_in(batch.column("id"), value_set=want)))
    table = pa.Table.from_batches(found) if found else pa.table({})
    return {i: k for k, i in enumerate(table.column("id").to_pylist())}, table


def stored_vectors(store: GalleryStore, gallery: str, version: str, ids: list[str]):
    """``(Q, d)`` stored embeddings of ``ids`` (given as text; int64 ids are parsed)."""
    import pyarrow as pa

    from raycompat.store.vectors import vectors  # the core's: pipelines would import Ray

    first = next(store.iter_batches(gallery, version, batch_size=1, columns=["id"]))
    if pa.types.is_int64(first.schema.field("id").type):
        try:
            ids = [int(i) for i in ids]
        except ValueError:
            raise StoreError(f"{gallery}/{version} has int64 ids; got {ids}") from None
    where, table = _stored_rows(store, gallery, version, ids, ["embedding"])
    missing = [i for i in ids if i not in where]
    if missing:
        raise StoreError(f"{gallery}/{version} holds no row with id(s) {missing}")
    return vectors(table, "embedding")[[where[i] for i in ids]]


def _column_names(store: GalleryStore, gallery: str, version: str) -> list[str]:
    """The version's columns, from its first file's footer (no row is decoded)."""
    info = store.version(gallery, version)
    path, source = next(iter(store.version_files(gallery, info)))
    with store.open_file(info, path, source) as parquet:
        return parquet.schema_arrow.names


def labels_of(store: GalleryStore, gallery: str, version: str, ids: list[np.ndarray]) -> list:
    """Stored ``label`` of each id, per query (``ids``: one array per query; None where
    unlabelled)."""
    wanted = sorted({i for row in ids for i in row.tolist()})
    if not wanted or "label" not in _column_names(store, gallery, version):
        return [[None] * len(row) for row in ids]
    where, table = _stored_rows(store, gallery, version, wanted, ["label"])
    labels = table.column("label").to_pylist()
    return [[labels[where[i]] if i in where else None for i in row.tolist()] for row in ids]


def search(args) -> dict:
    """Top-k hits per query (only items found; see the module docstring). faiss prints from
    C++ to the process's stdout while it loads or builds an index: sent to stderr here."""
    if args.k < 1:
        raise QueryError(f"-k must be >= 1 (hits per query), got {args.k}")
    from raycompat.index.search import stdout_to_stderr  # faiss: only this command loads it

    with stdout_to_stderr():
        return _search(args)


def _search(args) -> dict:
    from raycompat.index.version_index import open_version_index

    store = open_store(args.store)
    catalog = Catalog(store)
    catalog.model(args.model)
    grant = catalog.queryable_version(args.gallery, args.model)
    queries = query_vectors(args, store, catalog, grant.gallery_version)
    names = args.images or args.ids or [f"{args.vectors}[{q}]" for q in range(len(queries))]
    # Built on first use, and rebuilt when the stored one fails verification (it is derived data).
    index = open_version_index(store, args.gallery, grant.gallery_version, rebuild=True)
    hits = _hits(index, queries, args, names)
    labels = labels_of(store, args.gallery, grant.gallery_version, [ids for _, ids in hits])
    return {
        "gallery": args.gallery,
        "gallery_version": grant.gallery_version,
        "relation": grant.relation,
        "model": args.model,
        "results": [
            {
                "query": str(name),
                "image": name if args.images else None,
                "ids": [str(i) for i in ids.tolist()],
                # finite for every hit of finite vectors; None keeps --json valid JSON regardless
                "scores": [float(s) if np.isfinite(s) else None for s in scores.tolist()],
                "labels": lrow,
            }
            for name, (scores, ids), lrow in zip(names, hits, labels, strict=True)
        ],
    }


def _hits(index, queries: np.ndarray, args, names: list) -> list[tuple[np.ndarray, np.ndarray]]:
    """``index.hits`` of the queries (zero-padded to the version's width, BCT sec. 3.2); a note
    on stderr when a query got fewer than ``-k``."""
    width = index.info.width
    shared = queries[:, :width]
    if shared.shape[1] < width:  # a narrower query model
        shared = np.pad(shared, ((0, 0), (0, width - shared.shape[1])))
    # --nprobe tunes IVF indexes (large versions); an exact flat index has nothing to tune
    nprobe = args.nprobe if index.index.is_ivf else None
    try:
        hits = index.hits(np.ascontiguousarray(shared, dtype=np.float32), args.k, nprobe=nprobe)
    except ZeroNormError as err:
        bad = ", ".join(str(names[row]) for row in err.rows)
        raise ZeroNormError(
            f"query {bad} is a zero vector for model {args.model}: cosine search cannot rank "
            f"the gallery for it",
            err.rows,
        ) from None
    short = [len(ids) for _, ids in hits if len(ids) < args.k]
    if short:
        note = _short_note(index, args.k, nprobe, short, len(hits))
        print(f"{PROG}: note: {note}", file=sys.stderr)
    return hits


def _short_note(index, k: int, nprobe: int | None, short: list[int], queries: int) -> str:
    """Why ``short`` (hit counts below k) of ``queries`` queries got fewer than ``k`` hits."""
    rows, version = index.index.ntotal, index.info.version
    if rows < k:
        why = f"version {version} holds {rows} rows"
    else:
        lists = nprobe or index.index.index.nprobe
        why = f"the {lists} inverted list(s) visited per query hold fewer; raise --nprobe"
    fewest = min(short)
    return f"{len(short)} of {queries} queries got fewer than -k {k} hits (fewest {fewest}): {why}"


def report(args) -> dict | str:
    directory = Path(args.run)
    name = "report.json" if args.json else "report.md"
    path = directory / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: give the report directory of an upgrade run "
            f"(<report_dir>/<name>/, written by jobs/upgrade.py)"
        )
    text = path.read_text()
    return json.loads(text) if args.json else text


PROG = "raycompat"
_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float:
    """``"24h"``, ``"90m"``, ``"2d"``, ``"30s"`` or plain seconds -> seconds."""
    unit = text[-1:].lower()
    number = text[:-1] if unit in _DURATION else text
    try:
        value = float(number) * _DURATION.get(unit, 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration like 24h, 90m or 3600"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be >= 0")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (``--nprobe``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return value


def gc(args) -> dict:
    """List (``--dry-run``) or delete what ``raycompat.store.gc`` finds, and what it keeps and
    why; refuses an unmarked folder (exit 2); see docs/store.md."""
    from raycompat.store.gc import collect, make_plan

    store = open_store(args.store)
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
    from raycompat.store.marker import MARKER_NAME, read_marker, store_contents

    store = GalleryStore(args.store)
    uri = store.uri()
    marker = read_marker(store.backend)
    if marker is not None:
        return f"{uri} is already marked ({marker.format}, created {marker.created})"
    found = store_contents(store.backend)
    if not found and not args.force:
        raise MissingStoreError(
            f"{uri} holds no gallery record (*/_versions/*.json) and no model catalog "
            f"(_models/*.json), so it does not look like a store; not marked (--force marks it)"
        )
    store.mark()
    return f"marked {uri} as a raycompat store ({MARKER_NAME}): {', '.join(found) or 'empty'}"


def adopt(args) -> dict:
    """Publish the table at ``args.uri`` (a Delta or Iceberg snapshot, or a Parquet folder) as
    a version, in place; the files are validated by Ray tasks (the only command that starts
    Ray, after the cheap checks)."""
    import ray

    from raycompat.cluster.pipelines.adopt import run_adoption
    from raycompat.store.adopt import AdoptOptionError, plan_adoption

    store = GalleryStore(args.store)  # a writer: a new store is created by its first record
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
    if plan.published is None and not ray.is_initialized():  # a rerun completes without Ray
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    normalized = {"auto": None, "yes": True, "no": False}[args.normalized]
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
    """A gallery's versions (who wrote each), every decision with its reason, and its query
    grants (``store/history.py``); reads the store, never writes it. An unknown gallery is a
    usage error listing the galleries that exist."""
    from raycompat.store.history import gallery_history

    return gallery_history(open_store(args.store), args.gallery)


def _history_parser(sub, parents: list) -> None:
    p = sub.add_parser(
        "history",
        help="a gallery's story: versions and who wrote them, every decision (refused and "
        "failed too) with its reason, and which model queries which version",
        description="example: raycompat history mnist --store outputs/upgrade/store",
        parents=parents,
    )
    p.add_argument("gallery", help="the gallery's name (an unknown one lists those that exist)")
    p.add_argument("--store", required=True, help="store root: a folder or s3://bucket/prefix")


def _as_of(text: str) -> str:
    """``--as-of``, checked by argparse (a usage error, exit 2) and passed on as given."""
    from raycompat.store.table_formats import parse_as_of

    try:
        parse_as_of(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def export(args) -> dict | str:
    """Write a published version as a Delta or Iceberg table (no Ray): one summary line, or
    the summary as JSON with ``--json``; an option of the other format exits 2."""
    from raycompat.store.export import ExportOptionError, export_version

    options = {"mode": args.mode, "catalog_uri": args.catalog_uri, "warehouse": args.warehouse}
    try:
        summary = export_version(
            open_store(args.store), args.gallery, args.version, args.format, args.target, **options
        )
    except ExportOptionError as error:
        print(error_line(PROG, error), file=sys.stderr)
        raise SystemExit(2) from None
    return summary.to_dict() if args.json else summary.line()


COMMANDS = {
    "versions": versions,
    "models": models,
    "search": search,
    "report": report,
    "gc": gc,
    "mark-store": mark_store,
    "adopt": adopt,
    "export": export,
    "history": history,
}


def parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        DEBUG_FLAG,
        action="store_true",
        default=argparse.SUPPRESS,  # so a subcommand's default cannot reset the top-level flag
        help=f"show the traceback of an error (or set {DEBUG_ENV}=1)",
    )
    debug.add_argument(
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show our debug log lines too (weights read, datasets opened...)",
    )
    top = argparse.ArgumentParser(
        prog="raycompat", description=__doc__.splitlines()[0], parents=[debug]
    )
    sub = top.add_subparsers(dest="command", required=True)
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="JSON instead of a table")
    p = sub.add_parser(
        "versions",
        help="a gallery's versions, lineage and query models",
        parents=[debug, as_json],
    )
    p.add_argument("gallery")
    p.add_argument("--store", required=True, help="store root: a folder or s3://bucket/prefix")
    p = sub.add_parser("models", help="registered model versions", parents=[debug, as_json])
    p.add_argument("--store", required=True)
    p = sub.add_parser(
        "search",
        help="top-k gallery ids for query images, vectors or stored ids",
        parents=[debug, as_json],
    )
    p.add_argument("images", nargs="*", type=str, help="query images, embedded with --model")
    p.add_argument("--vectors", help="query vectors of --model: a .npy (Q, d) or a Parquet file")
    p.add_argument("--ids", nargs="+", help="query with rows stored in the version --model queries")
    p.add_argument("--store", required=True)
    p.add_argument("--gallery", required=True)
    p.add_argument("--model", required=True, help="a registered model version")
    p.add_argument("-k", type=int, default=5)
    p.add_argument(
        "--nprobe",
        type=positive_int,
        default=None,
        help="inverted lists visited per query by an IVF index (default: the build's, which "
        "grows with the gallery; ignored by an exact flat index)",
    )
    p = sub.add_parser("report", help="show an upgrade run's report", parents=[debug])
    p.add_argument("run", help="the run's report directory, e.g. outputs/upgrade/report/<name>")
    p.add_argument("--json", action="store_true", help="report.json instead of report.md")
    p = sub.add_parser(
        "gc",
        help="remove abandoned staging areas, stale temporary files, old index builds and "
        "(with --keep-versions) superseded versions",
        parents=[debug, as_json],
    )
    p.add_argument("--store", required=True)
    p.add_argument(
        "--older-than",
        type=duration_s,
        default=duration_s("24h"),
        help="only what is older than this (24h, 90m, 2d or seconds; default 24h; at least "
        f"the lease timeout, {DEFAULT_TIMEOUT_S:g} s): a staging area counts from when its "
        "lease expired",
    )
    p.add_argument(
        "--keep-versions",
        type=int,
        default=None,
        help="also remove published versions older than the newest K, unless a registered "
        "model queries them or the newest version's lineage names them",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would go and what is kept, with reasons; delete nothing",
    )
    p = sub.add_parser(
        "mark-store",
        help="mark a store written before store markers, so gc may manage it",
        parents=[debug],
    )
    p.add_argument("--store", required=True, help="store root: a folder or s3://bucket/prefix")
    p.add_argument(
        "--force",
        action="store_true",
        help="mark it even if it holds no version record and no model catalog yet",
    )
    p = sub.add_parser(
        "adopt",
        help="publish an existing table (Delta, Iceberg or a Parquet folder; local or s3://) as "
        "a version, in place (no copy); its files are pinned and validated on Ray",
        parents=[debug, as_json],
    )
    p.add_argument(
        "uri",
        help="a Delta or Iceberg table, or a folder of *.parquet files (local or s3://); or "
        "iceberg:<namespace>.<table> in --catalog-uri",
    )
    p.add_argument("--store", required=True, help="store root: a folder or s3://bucket/prefix")
    p.add_argument("--gallery", required=True)
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
        type=_as_of,
        default=None,
        help="a Delta version or Iceberg snapshot id, or an ISO timestamp (default: current)",
    )
    p.add_argument(
        "--catalog-uri",
        default=None,
        help="for URI iceberg:<namespace>.<table>: the SQL catalog (sqlite:///path/catalog.db)",
    )
    p.add_argument("--warehouse", default=None, help="the catalog's warehouse (optional)")
    p.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS or local)")
    _export_parser(sub, [debug, as_json])
    _history_parser(sub, [debug, as_json])
    return top


def _export_parser(sub, parents: list) -> None:
    p = sub.add_parser(
        "export",
        help="write a version as a Delta or Iceberg table that Spark, Trino, DuckDB and Ray "
        "Data read without raycompat (float16 is widened to float32)",
        parents=parents,
    )
    p.add_argument(
        "target", help="Delta: a folder or s3:// URI; Iceberg: namespace.table in --catalog-uri"
    )
    p.add_argument("--store", required=True, help="store root: a folder or s3://bucket/prefix")
    p.add_argument("--gallery", required=True)
    p.add_argument("--version", required=True, help="the published version to export")
    p.add_argument("--format", required=True, choices=["delta", "iceberg"])
    p.add_argument(
        "--mode",
        choices=["error", "overwrite"],
        default=None,
        help="Delta: overwrite replaces an existing Delta table's rows (default: refuse it)",
    )
    p.add_argument("--catalog-uri", help="Iceberg: the SQL catalog, e.g. sqlite:///catalog.db")
    p.add_argument("--warehouse", help="Iceberg: where its tables live (a folder or s3:// URI)")


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0, 1 for a store or data error (a corrupt record among those listed, a
    version or grant that is missing), 2 for a usage error (no store at ``--store``, a
    :class:`QueryError`)."""
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
    except (*USAGE_ERRORS, QueryError, StoreError, FileNotFoundError, ZeroNormError) as err:
        if debug:
            raise
        print(error_line(PROG, err), file=sys.stderr)
        return 2 if isinstance(err, (*USAGE_ERRORS, QueryError, GcArgumentError)) else 1
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
