"""``raycompat``: inspect a store's galleries and models, and search with any registered model.

    raycompat versions <gallery> --store ROOT     versions, their model and lineage, and which
                                                  models may query each
    raycompat models --store ROOT                 registered model versions
    raycompat search --store ROOT --gallery G --model M IMAGE [IMAGE ...] [-k 5]
    raycompat report RUN_DIR [--json]             an upgrade run's report (report.md, or the
                                                  decisions and matrix as JSON)

``search`` embeds the images with model M, finds the gallery version M may query (its catalog
grant: extracted, compatible or transformed), and searches that version's faiss index (built on
first use, rebuilt when it fails its checksums). A compatible model of another width is compared
on the shared first coordinates (BCT: zero-padding), as in training. No Ray: this is the core.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from raycompat.credentials import configure_logging, scrub
from raycompat.data.image_folder import read_image
from raycompat.distances import ZeroNormError
from raycompat.store import GalleryStore
from raycompat.store.catalog import Catalog
from raycompat.store.errors import StoreError
from raycompat.store.index import open_version_index


def gallery_versions(store: GalleryStore, gallery: str) -> list[dict]:
    """Every published version of ``gallery``: model, width, rows, lineage and query models."""
    grants = Catalog(store).grants(gallery)
    rows = []
    for info in store.versions(gallery):
        queried_by = [g.model_version for g in grants if g.gallery_version == info.version]
        rows.append(
            {
                "version": info.version,
                "model_version": info.model_version,
                "width": info.width,
                "rows": info.rows,
                "lineage": info.lineage,
                "created": info.created,
                "queried_by": queried_by,
            }
        )
    return rows


def versions(args) -> dict:
    rows = gallery_versions(GalleryStore(args.store), args.gallery)
    if not rows:
        raise StoreError(f"gallery {args.gallery!r} has no published version in {args.store}")
    return {"gallery": args.gallery, "versions": rows}


def models(args) -> dict:
    return {"models": [vars(m) for m in Catalog(GalleryStore(args.store)).models()]}


def embed_images(model_uri: str, paths: list[str]) -> np.ndarray:
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


def search(args) -> dict:
    store = GalleryStore(args.store)
    catalog = Catalog(store)
    record = catalog.model(args.model)
    grant = catalog.queryable_version(args.gallery, args.model)
    if Path(record.uri).is_dir():
        queries = embed_images(record.uri, args.images)
    else:  # files in an S3 store: copy them out first
        with tempfile.TemporaryDirectory() as local:
            queries = embed_images(catalog.fetch_model_files(args.model, local), args.images)
    # Built on first use, and rebuilt when the stored one fails verification (it is derived data).
    index = open_version_index(store, args.gallery, grant.gallery_version, rebuild=True)
    width = index.info.width
    shared = queries[:, :width]
    if shared.shape[1] < width:  # a narrower query model: zero-pad (BCT sec. 3.2)
        shared = np.pad(shared, ((0, 0), (0, width - shared.shape[1])))
    try:
        scores, ids = index.search(np.ascontiguousarray(shared, dtype=np.float32), args.k)
    except ZeroNormError as err:
        images = ", ".join(args.images[row] for row in err.rows)
        raise ZeroNormError(
            f"model {args.model} embeds query image(s) {images} to a zero vector: cosine search "
            f"cannot rank the gallery for them",
            err.rows,
        ) from None
    return {
        "gallery": args.gallery,
        "gallery_version": grant.gallery_version,
        "relation": grant.relation,
        "model": args.model,
        "results": [
            {
                "image": p,
                "ids": [None if i is None else str(i) for i in row],
                "scores": [float(s) for s in srow],
            }
            for p, row, srow in zip(args.images, ids, scores, strict=True)
        ],
    }


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


COMMANDS = {"versions": versions, "models": models, "search": search, "report": report}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="raycompat", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser("versions", help="a gallery's versions, lineage and query models")
    p.add_argument("gallery")
    p.add_argument("--store", required=True, help="store root: a folder or s3://bucket/prefix")
    p = sub.add_parser("models", help="registered model versions")
    p.add_argument("--store", required=True)
    p = sub.add_parser("search", help="top-k gallery ids for query images")
    p.add_argument("images", nargs="+", type=str)
    p.add_argument("--store", required=True)
    p.add_argument("--gallery", required=True)
    p.add_argument("--model", required=True, help="a registered model version")
    p.add_argument("-k", type=int, default=5)
    p = sub.add_parser("report", help="show an upgrade run's report")
    p.add_argument("run", help="the run's report directory, e.g. outputs/upgrade/report/<name>")
    p.add_argument("--json", action="store_true", help="report.json instead of report.md")
    return top


def main(argv: list[str] | None = None) -> int:
    configure_logging("%(name)s: %(message)s", stream=sys.stderr)  # log lines scrubbed
    args = parser().parse_args(argv)
    if getattr(args, "images", None):
        missing = [p for p in args.images if not Path(p).is_file()]
        if missing:
            print(f"raycompat: query image(s) not found: {', '.join(missing)}", file=sys.stderr)
            return 2
    try:
        out = COMMANDS[args.command](args)
    except (StoreError, FileNotFoundError, ZeroNormError) as err:
        print(f"raycompat: {scrub(err)}", file=sys.stderr)
        return 1
    print(out if isinstance(out, str) else json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
