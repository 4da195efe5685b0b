"""The CLI's text tables (``raycompat/cli/tables.py``) and what ``gc`` prints with them
(``raycompat/cli/commands/maintenance.py``)."""

from __future__ import annotations

from raycompat.cli.commands.maintenance import render_gc
from raycompat.cli.tables import MAX_CELL, table


def test_long_cells_are_cut_except_in_uncut_columns():
    rows = [{"a": "x" * 80, "b": "y" * 80}]
    header, rule, line = table(rows, [("a", "A"), ("b", "B")], uncut=("b",)).splitlines()
    assert line.split() == ["x" * (MAX_CELL - 1) + "…", "y" * 80]
    assert len(rule.split()[1]) == 80  # the column is as wide as its longest cell


def test_gc_dry_run_prints_every_path_whole():
    """Issue 40, item 8: a path cut with "…" cannot be copied; each prints in full."""
    long = "s3://bucket/" + "deep/" * 30 + "_index/v1/0123456789abcdef/index.faiss"
    short = "/store/g/_staging/v2"
    items = [
        {"kind": "index", "bytes": 12, "reason": "a build no pointer names", "uri": long},
        {"kind": "staging", "bytes": 3, "reason": "abandoned", "uri": short},
    ]
    text = render_gc({"dry_run": True, "items": items, "kept": [], "bytes": 15})
    lines = text.splitlines()
    assert lines[2].endswith(f"  {long}") and lines[3].endswith(f"  {short}")
    assert "…" not in text and lines[-1] == "would remove 2 item(s), 15 bytes"
