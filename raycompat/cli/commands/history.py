"""``raycompat history GALLERY``: a gallery's story, one table per section.

Its versions (the operation that made each, its parameters and who wrote it: Ray submission id,
host, OS user; an adopted one with its source), every decision with its reason and who recorded
it (``*`` marks the standing one; refused and failed ones too), its query grants
(``serving/history.py``), what each model serves and every alias change
(``serving/serving_map.py``). Reads the store, never writes it; an unknown gallery is a usage
error listing those that exist.
"""

from __future__ import annotations

from raycompat.cli.arguments import STORE, add_gallery
from raycompat.cli.command import Command
from raycompat.cli.store_options import add_store_arguments, open_store
from raycompat.cli.tables import cell, corrupt_lines, mark_no_weights, table


def history(args) -> dict:
    from raycompat.serving.history import gallery_history
    from raycompat.serving.serving_map import with_serving

    store = open_store(args)
    out = with_serving(store, args.gallery, gallery_history(store, args.gallery))
    return {**out, **_without_weights(store, out)}


def _without_weights(store, out: dict) -> dict:
    """``{"without_weights": [...]}``: the models the history names that were registered
    without weights (adopted: they query with vectors only); ``{}`` when none."""
    from raycompat.store.catalog.models import Catalog

    sections = ("versions", "grants", "serving")
    named = {row["model_version"] for key in sections for row in out.get(key, [])}
    without = sorted(named & set(Catalog(store).without_weights()))
    return {"without_weights": without} if without else {}


VERSIONS = [
    ("version", "version"),
    ("created", "created"),
    ("model_version", "model"),
    ("rows", "rows"),
    ("width", "width"),
    ("dtype", "dtype"),
    ("lineage", "lineage"),
    ("operation", "operation"),
    ("written_by", "written by"),
]
DECISIONS = [
    ("created", "created"),
    ("model_version", "model"),
    ("attempt", "attempt"),
    ("standing", "stands"),
    ("outcome", "outcome"),
    ("against", "against"),
    ("recorded_by", "by"),
    ("reason", "reason"),
]
GRANTS = [
    ("model_version", "model"),
    ("gallery_version", "queries"),
    ("relation", "relation"),
    ("created", "created"),
    ("evidence", "evidence"),
]
SERVING = [("model_version", "model"), ("serves", "serves"), ("source", "from")]
MARKED = ("versions", "grants", "serving")  # sections whose model column marks "(no weights)"
ALIASES = [
    ("seq", "change"),
    ("model_version", "model"),
    ("action", "action"),
    ("gallery_version", "serves"),
    ("previous", "was"),
    ("created", "created"),
    ("writer", "by"),
]
NAMED = [
    ("alias", "alias"),
    ("seq", "change"),
    ("action", "action"),
    ("gallery_version", "version"),
    ("model_version", "model"),
    ("relation", "relation"),
    ("created", "created"),
    ("writer", "by"),
]


def _evidence(evidence: dict) -> str:
    """``{"cross": 0.71, "ecc": True}`` -> ``cross=0.7100 ecc=True`` (one cell)."""
    return " ".join(f"{k}={cell(v)}" for k, v in evidence.items()) or "-"


def _adopted(external: dict) -> str:
    """``root`` of an adopted version, and ``@delta v3`` for a table snapshot."""
    snapshot = external.get("table")
    return external["root"] + (f" @{snapshot['format']} v{snapshot['version']}" if snapshot else "")


def _parameters(version: dict) -> str:
    """``\nv2 transform: source=faces/v1@... h=1f0c...`` for a version whose record gives its
    operation's parameters (Delta's ``operationParameters``); ``""`` for an older record."""
    if not version.get("parameters"):
        return ""
    pairs = " ".join(f"{k}={cell(v, None)}" for k, v in version["parameters"].items())
    return f"\n{version['version']} {version['operation']}: {pairs}"


def _serving_sections(out: dict) -> list[str]:
    """The "serving" and "alias changes" tables (``serving/serving_map.py``)."""
    if "serving" not in out:
        return []
    serving = table(out["serving"], SERVING, uncut=["source"]) if out["serving"] else "none"
    changes = out["aliases"]
    aliases = table(changes, ALIASES, uncut=["writer"]) if changes else "none"
    named = out.get("named_aliases", [])
    named_table = table(named, NAMED, uncut=["writer"]) if named else "none"
    return [
        "serving\n" + serving,
        "alias changes\n" + aliases,
        "named aliases (`raycompat alias`)\n" + named_table,
    ]


def render_history(out: dict) -> str:
    without = out.get("without_weights", [])
    out = {
        k: mark_no_weights(out[k], ["model_version"], without) if k in MARKED else v
        for k, v in out.items()
    }
    versions = [{**v, "written_by": "; ".join(v["written_by"])} for v in out["versions"]]
    operations = "".join(_parameters(v) for v in versions)
    adopted = "".join(
        f"\nadopted {v['version']} from {_adopted(v['external'])}"
        for v in versions
        if v["external"] is not None
    )
    decisions = [{**d, "standing": "*" if d["standing"] else ""} for d in out["decisions"]]
    grants = [{**g, "evidence": _evidence(g["evidence"])} for g in out["grants"]]
    sections = [
        f"gallery {out['gallery']}",
        "versions\n" + table(versions, VERSIONS, uncut=["written_by"]) + operations + adopted,
        "decisions\n"
        + (table(decisions, DECISIONS, uncut=["reason"]) if decisions else "none recorded"),
        "query grants\n" + (table(grants, GRANTS, uncut=["evidence"]) if grants else "none"),
        *_serving_sections(out),
    ]
    return "\n\n".join(sections) + corrupt_lines(out)


def _arguments(p) -> None:
    add_gallery(p, "the gallery's name (an unknown one lists those that exist)")
    add_store_arguments(p)


COMMANDS = (
    Command(
        "history",
        "a gallery's story: versions, the operation that made each and who wrote them, "
        "every decision (refused and failed too) with its reason and who recorded it, and "
        "which model queries which version",
        _arguments,
        history,
        render_history,
        example=f"raycompat history mnist --store {STORE}",
    ),
)
