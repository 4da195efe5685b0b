"""The live serving map of a gallery: what each query model serves, and may roll back to.

Given to gc by its caller (``store/maintenance/gc.py`` takes it as ``served``: a version a live
model serves or may roll back to is kept; ``raycompat gc`` passes it) and read by
``raycompat history`` (one row per model: what it serves, from where, or why it serves
nothing). Live means: it holds a grant or an alias log on the gallery, was not revoked there
(``served_log.py``) and was not retired (``store/catalog/retired.py``). Every version a named alias
(``aliases.py``: ``prod``) points at or may roll back to is in the map too, whatever
became of its model: an alias is the operator's to move. Reads the store, never writes it.
"""

from __future__ import annotations

from dataclasses import asdict

import pyarrow.fs as pafs

from raycompat.errors import StoreError
from raycompat.serving.aliases import NAMED_DIR
from raycompat.serving.aliases import log as named_log
from raycompat.serving.aliases import names as named_aliases
from raycompat.serving.aliases import reachable as named_reachable
from raycompat.serving.served_log import ALIASES_DIR, RevokedError, current, granted_version, log
from raycompat.store.catalog.models import Catalog
from raycompat.store.catalog.retired import RetiredModelError, retired
from raycompat.store.gallery import GalleryStore


def _aliased_models(store: GalleryStore, gallery: str) -> list[str]:
    selector = pafs.FileSelector(store.path(gallery, ALIASES_DIR), allow_not_found=True)
    entries = store.filesystem.get_file_info(selector)
    return sorted(e.base_name for e in entries if e.type == pafs.FileType.Directory)


def query_models(store: GalleryStore, gallery: str) -> list[str]:
    """Every model that holds a grant or an alias log on ``gallery``, live or not, sorted."""
    models = {g.model_version for g in Catalog(store).grants(gallery)}
    return sorted(models | set(_aliased_models(store, gallery)))


def reachable(store: GalleryStore, gallery: str, model: str) -> tuple[str | None, list[str]]:
    """``(serves, rollback targets)`` of a live model: what it serves now (None if revoked)
    and the versions successive rollbacks would return to; ``(None, [])`` once revoked."""
    records = log(store, gallery, model)
    grant = granted_version(store, gallery, model)
    if not records:
        return grant, []
    if records[-1].gallery_version is None:
        return None, []
    chain, back = [], records[-1].back
    while back is not None:
        version = records[back - 1].gallery_version if back else grant
        back = records[back - 1].back if back else None
        if version is None:  # a revoke further back: rollbacks stop serving there
            break
        chain.append(version)
    return records[-1].gallery_version, chain


def serving_map(store: GalleryStore, gallery: str) -> dict[str, dict[str, list[str]]]:
    """``{version: {"queried by": [models], "a rollback target of": [models], "aliased as":
    [aliases], "a rollback target of alias": [aliases]}}`` for the live models of ``gallery``
    (grants and aliases, less revoked and retired ones) and its named aliases. A corrupt
    grant, alias, named alias or tombstone raises: gc must not guess."""
    out: dict[str, dict[str, list[str]]] = {}
    for model in query_models(store, gallery):
        if retired(store, model) is not None:
            continue
        serves, chain = reachable(store, gallery, model)
        if serves is not None:
            out.setdefault(serves, {}).setdefault("queried by", []).append(model)
        for version in dict.fromkeys(v for v in chain if v != serves):
            out.setdefault(version, {}).setdefault("a rollback target of", []).append(model)
    for alias in named_aliases(store, gallery):
        now, chain = named_reachable(named_log(store, gallery, alias))
        if now is not None:
            out.setdefault(now["gallery_version"], {}).setdefault("aliased as", []).append(alias)
        earlier = dict.fromkeys(p["gallery_version"] for p in chain)
        for version in (v for v in earlier if now is None or v != now["gallery_version"]):
            out.setdefault(version, {}).setdefault("a rollback target of alias", []).append(alias)
    return out


def serving_rows(store: GalleryStore, gallery: str) -> tuple[list[dict], list[dict], list]:
    """``(serving, aliases, corrupt)`` for ``raycompat history``: one row per model
    (``model_version``, ``serves``, ``source``; ``serves`` None with the reason in ``source``
    when revoked or retired), every alias record oldest first, and ``(uri, error)`` for each
    model whose records cannot be read."""
    models = {g.model_version for g in Catalog(store).grants_report(gallery)[0]}
    models |= set(_aliased_models(store, gallery))
    rows, changes, corrupt = [], [], []
    for model in sorted(models):
        try:
            changes += [asdict(r) for r in log(store, gallery, model)]
            serving = current(store, gallery, model)
            rows.append(
                {
                    "model_version": model,
                    "serves": serving.gallery_version,
                    "source": serving.source,
                }
            )
        except (RevokedError, RetiredModelError) as error:
            rows.append({"model_version": model, "serves": None, "source": str(error)})
        except StoreError as error:
            corrupt.append((store.uri(gallery, ALIASES_DIR, model), str(error)))
    changes.sort(key=lambda r: (r["created"], r["model_version"], r["seq"]))
    return rows, changes, corrupt


def named_alias_rows(store: GalleryStore, gallery: str) -> tuple[list[dict], list]:
    """Every named alias record of ``gallery`` (oldest first, ``writer`` added: who wrote it, in
    words) and ``(uri, error)`` for each alias whose log cannot be read."""
    rows, corrupt = [], []
    for alias in named_aliases(store, gallery):
        try:
            rows += [{**asdict(r), "writer": r.writer()} for r in named_log(store, gallery, alias)]
        except StoreError as error:
            corrupt.append((store.uri(gallery, NAMED_DIR, alias), str(error)))
    rows.sort(key=lambda r: (r["created"], r["alias"], r["seq"]))
    return rows, corrupt


def with_serving(store: GalleryStore, gallery: str, history: dict) -> dict:
    """``history`` (``history.gallery_history``) with ``serving`` and ``aliases`` added (see
    :func:`serving_rows`), ``named_aliases`` (every named alias record, oldest first) and their
    unreadable records listed under ``corrupt``."""
    rows, changes, corrupt = serving_rows(store, gallery)
    named, named_corrupt = named_alias_rows(store, gallery)
    corrupt += named_corrupt
    out = {**history, "serving": rows, "aliases": changes, "named_aliases": named}
    if corrupt:
        out["corrupt"] = history.get("corrupt", []) + [
            {"file": uri, "error": error} for uri, error in corrupt
        ]
    return out
