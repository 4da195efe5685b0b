"""Aligned text tables for the ``raycompat`` CLI (``--json`` prints the same data as JSON).

Each command's renderer (``raycompat/cli/commands/``) takes the dict its handler returns and
gives the text a person reads with :func:`table`: one row per gallery, version, model, search
hit or garbage-collection item, columns aligned, long cells cut with ``…`` so a row fits a
terminal line, and corrupt records listed after the table (:func:`corrupt_lines`).
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_CELL = 48


def cell(value: object, limit: int | None = MAX_CELL) -> str:
    """One cell's text: "-" for None, 4 decimals for a float, a list comma-joined, cut to
    ``limit`` characters with "…"."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value) or "-"
    text = str(value).replace("\n", " ")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def table(
    rows: Sequence[dict], columns: Sequence[tuple[str, str]], uncut: Sequence[str] = ()
) -> str:
    """``columns``: ``(key, header)`` pairs. Numbers are right-aligned, text left-aligned;
    cells longer than ``MAX_CELL`` are cut, except in the ``uncut`` columns (put them last)."""
    cells = [
        [cell(row.get(key), None if key in uncut else MAX_CELL) for key, _ in columns]
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


def corrupt_lines(out: dict) -> str:
    """The corrupt records a listing skipped, one ``CORRUPT file: error`` line each."""
    bad = out.get("corrupt", [])
    return "".join(f"\nCORRUPT {c['file']}: {c['error']}" for c in bad)


NO_WEIGHTS = "(no weights)"


def mark_no_weights(rows: Sequence[dict], keys: Sequence[str], without: Sequence[str]) -> list:
    """``rows`` with each model name under ``keys`` (a name or a list of names) that is in
    ``without`` (models registered without weights, e.g. adopted) shown as ``name (no
    weights)``."""

    def mark(name):
        if isinstance(name, list):
            return [mark(n) for n in name]
        return f"{name} {NO_WEIGHTS}" if name in without else name

    return [{**row, **{k: mark(row[k]) for k in keys if k in row}} for row in rows]


def change_answer(args, record, line: str) -> dict | str:
    """A serving or alias change's answer: ``line``, or with ``--json`` whether anything changed
    and the change's record (``record`` None: it already was so)."""
    from dataclasses import asdict

    if not args.json:
        return line
    return {"changed": record is not None, "record": asdict(record) if record else None}
