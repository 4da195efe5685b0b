"""Aligned text tables for the ``raycompat`` CLI (``--json`` prints the same data as JSON).

Each renderer takes the dict a command returns and gives the text a person reads: one row per
gallery, version, model, search hit or garbage-collection item, columns aligned, long cells cut with
``…`` so a row fits a terminal line, and corrupt records listed after the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from raycompat.cli.serving import serving_sections

MAX_CELL = 48


def _cell(value: object, limit: int | None = MAX_CELL) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value) or "-"
    text = str(value).replace("\n", " ")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def table(
    rows: Sequence[dict], columns: Sequence[tuple[str, str]], uncut: Sequence[str] = ()
) -> str:
    """``columns``: ``(key, header)`` pairs. Numbers are right-aligned, text left-aligned;
    cells longer than ``MAX_CELL`` are cut, except in the ``uncut`` columns (put them last)."""
    cells = [
        [_cell(row.get(key), None if key in uncut else MAX_CELL) for key, _ in columns]
        for row in rows
    ]
    widths = [
        max([len(header)] + [len(r[i]) for r in cells]) for i, (_, header) in enumerate(columns)
    ]
    numeric = [
        bool(rows) and all(isinstance(r.get(k), int | float) for r in rows) for k, _ in columns
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line([h for _, h in columns]), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _corrupt(out: dict) -> str:
    bad = out.get("corrupt", [])
    return "".join(f"\nCORRUPT {c['file']}: {c['error']}" for c in bad)


def galleries(out: dict) -> str:
    rows = [
        {**g, "query_models": [f"{m}->{v}" for m, v in g["query_models"].items()]}
        for g in out["galleries"]
    ]
    columns = [
        ("gallery", "gallery"),
        ("versions", "versions"),
        ("newest", "newest"),
        ("model_version", "model"),
        ("rows", "rows"),
        ("query_models", "query models (-> version)"),
    ]
    body = table(rows, columns, uncut=["query_models"]) if rows else "no gallery"
    return f"store {out['store']}\n{body}{_corrupt(out)}"


def versions(out: dict) -> str:
    columns = [
        ("version", "version"),
        ("model_version", "model"),
        ("rows", "rows"),
        ("width", "width"),
        ("dtype", "dtype"),
        ("lineage", "lineage"),
        ("queried_by", "query models"),
        ("created", "created"),
    ]
    return f"gallery {out['gallery']}\n" + table(out["versions"], columns) + _corrupt(out)


def models(out: dict) -> str:
    columns = [
        ("model_version", "model"),
        ("embed_dim", "dim"),
        ("method", "method"),
        ("parent", "parent"),
        ("created", "created"),
        ("uri", "files"),
    ]
    return table(out["models"], columns) + _corrupt(out)


def search(out: dict) -> str:
    rows = [
        {"query": r["query"], "rank": rank + 1, "id": i, "score": s, "label": label}
        for r in out["results"]
        for rank, (i, s, label) in enumerate(zip(r["ids"], r["scores"], r["labels"], strict=True))
    ]
    head = (
        f"gallery {out['gallery']} version {out['gallery_version']} "
        f"({out['relation']} for model {out['model']})"
    )
    columns = [("query", "query"), ("rank", "rank"), ("id", "id"), ("score", "score")]
    return head + "\n" + table(rows, columns + [("label", "label")])


def gc(out: dict) -> str:
    verb = "would remove" if out["dry_run"] else "removed"
    columns = [("kind", "kind"), ("bytes", "bytes"), ("reason", "reason"), ("uri", "path")]
    body = table(out["items"], columns) if out["items"] else "nothing to remove"
    if out["dry_run"]:  # what is kept, and why: one line each
        body += "".join(f"\nkeep {k['what']}: {k['reason']}" for k in out.get("kept", []))
    return f"{body}\n{verb} {len(out['items'])} item(s), {out['bytes']:,} bytes"


def adopt(out: dict) -> str:
    norm = "normalized" if out["normalized"] else "not normalized"
    return (
        f"adopted {out['uri']} as gallery {out['gallery']} version {out['version']}: "
        f"{out['rows']:,} rows in {out['files']} file(s), {out['width']}-d {out['dtype']}, "
        f"{norm}; model {out['model_version']} queries it"
    )


def _evidence(evidence: dict) -> str:
    """``{"cross": 0.71, "ecc": True}`` -> ``cross=0.7100 ecc=True`` (one cell)."""
    return " ".join(f"{k}={_cell(v)}" for k, v in evidence.items()) or "-"


def _adopted(external: dict) -> str:
    """``root`` of an adopted version, and ``@delta v3`` for a table snapshot."""
    snapshot = external.get("table")
    return external["root"] + (f" @{snapshot['format']} v{snapshot['version']}" if snapshot else "")


HISTORY_VERSIONS = [
    ("version", "version"),
    ("created", "created"),
    ("model_version", "model"),
    ("rows", "rows"),
    ("width", "width"),
    ("dtype", "dtype"),
    ("lineage", "lineage"),
    ("written_by", "written by"),
]
HISTORY_DECISIONS = [
    ("created", "created"),
    ("model_version", "model"),
    ("attempt", "attempt"),
    ("standing", "stands"),
    ("outcome", "outcome"),
    ("against", "against"),
    ("reason", "reason"),
]
HISTORY_GRANTS = [
    ("model_version", "model"),
    ("gallery_version", "queries"),
    ("relation", "relation"),
    ("created", "created"),
    ("evidence", "evidence"),
]


def history(out: dict) -> str:
    """A gallery's versions (who wrote each; adopted ones with their source), decisions
    (``*`` marks the standing one, reasons in full) and query grants: one table each."""
    versions = [{**v, "written_by": "; ".join(v["written_by"])} for v in out["versions"]]
    adopted = "".join(
        f"\nadopted {v['version']} from {_adopted(v['external'])}"
        for v in versions
        if v["external"] is not None
    )
    decisions = [{**d, "standing": "*" if d["standing"] else ""} for d in out["decisions"]]
    grants = [{**g, "evidence": _evidence(g["evidence"])} for g in out["grants"]]
    sections = [
        f"gallery {out['gallery']}",
        "versions\n" + table(versions, HISTORY_VERSIONS, uncut=["written_by"]) + adopted,
        "decisions\n"
        + (table(decisions, HISTORY_DECISIONS, uncut=["reason"]) if decisions else "none recorded"),
        "query grants\n"
        + (table(grants, HISTORY_GRANTS, uncut=["evidence"]) if grants else "none"),
        *serving_sections(out),  # what each model serves, and alias changes (cli/serving.py)
    ]
    return "\n\n".join(sections) + _corrupt(out)


RENDERERS: dict[str, Callable[[dict], str]] = {
    "galleries": galleries,
    "versions": versions,
    "models": models,
    "search": search,
    "gc": gc,
    "adopt": adopt,
    "history": history,
}
