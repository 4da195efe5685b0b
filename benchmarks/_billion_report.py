"""docs/scale.md's tables of ``benchmarks/billion.py`` runs, rendered from their JSON files.

    .venv/bin/python benchmarks/_billion_report.py benchmarks/results/billion_4m_cpu.json \
        benchmarks/results/billion_cpu.json

One table per run, one row per step in the order it ran (the transform's commit a row of its
own): wall seconds, rows/s where the step moves rows, the driver's peak RSS (MB), the parts it
touched and ms per part where its cost should grow with parts, and the disk used after it (GB);
below it the kill and the resume, and the steps skipped and why. Then the largest run over the
smallest of the same part size, per step: time per row (or per part) and driver peak RSS.
``tests/benchmarks/test_billion.py`` checks that the docs hold the tables as they render.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROWS_STEPS = ("generate", "adopt", "transform", "validate_on_read", "export_delta")
PART_STEPS = ("commit (of the transform)", "versions", "history", "status", "gc_dry_run", "gc")


def _cell(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _rate(step: dict) -> str:
    rows_per_s = step.get("rows_per_s")
    return "-" if rows_per_s is None else f"{rows_per_s / 1e3:,.0f} k"


def run_table(result: dict) -> str:
    """The steps of one run, as a markdown table under a line naming its size."""
    head = (
        f"{result['rows']:,} rows, {result['parts']:,} parts of {result['args']['part_rows']:,}"
        f" ({result['width']}-d {result['dtype']}, int64 ids), "
        f"{result['machine'].get('cpu_model', '?')}, {result['machine']['cpu_count']} cores"
    )
    lines = [
        head,
        "",
        "| step | wall s | rows/s | driver peak MB | parts | ms/part | disk GB after |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, step in _rows(result["steps"]):
        disk = step.get("bytes_on_disk")
        lines.append(
            f"| {name} | {_cell(step['wall_s'])} | {_rate(step)} | "
            f"{_cell(step.get('driver_peak_rss_mb'), 0)} | {_cell(step.get('parts'))} | "
            f"{_cell(step.get('ms_per_part'))} | "
            f"{'-' if disk is None else f'{disk / 1e9:.2f}'} |"
        )
    skipped = [f"{name} skipped ({s['skipped']})" for name, s in result["steps"].items()
               if "skipped" in s]  # fmt: skip
    return "\n".join(lines + [""] + [_kill_line(result["steps"]["transform"])] + skipped)


def _rows(steps: dict) -> list[tuple[str, dict]]:
    """The steps that ran, the transform's commit after it as a row of its own (its ms per
    part are the record's cost: the commit reads part records, no rows)."""
    rows = []
    for name, step in steps.items():
        if "wall_s" not in step:
            continue
        rows.append((name, step))
        if name == "transform":
            commit = {"wall_s": step["second_run"]["commit_s"], "parts": step["parts_total"],
                      "ms_per_part": step["commit_ms_per_part"]}  # fmt: skip
            rows.append(("commit (of the transform)", commit))
    return rows


def _kill_line(transform: dict) -> str:
    first, second = transform["first_run"], transform["second_run"]
    return (
        f"Transform: SIGKILLed at {first['parts_at_kill']} of {transform['parts_total']} parts "
        f"after {first['wall_s']:.1f} s ({first['killed_processes']} processes); the rerun kept "
        f"{transform['parts_kept']} and wrote {transform['parts_redone']} in "
        f"{second['wall_s']:.1f} s; time lost {transform['time_lost_s']:.1f} s; the killed run "
        f"left {transform['tmp_files_left']} temporary file(s) "
        f"({transform['tmp_bytes_left'] / 1e6:.1f} MB) for gc."
    )


def ratios(small: dict, large: dict) -> str:
    """Largest run over smallest, per step both ran: time per row (steps that move rows) or
    per part (steps that grow with parts), and driver peak RSS."""
    lines = [
        f"{large['rows']:,} rows over {small['rows']:,}:",
        "",
        "| step | per row (x) | per part (x) | driver peak RSS (x) |",
        "|---|---|---|---|",
    ]
    others = dict(_rows(small["steps"]))
    for name, step in _rows(large["steps"]):
        other = others.get(name)
        if other is None:
            continue
        per_row = per_part = "-"
        if name in ROWS_STEPS and step.get("rows_per_s") and other.get("rows_per_s"):
            per_row = f"{other['rows_per_s'] / step['rows_per_s']:.2f}"
        if name in PART_STEPS and step.get("ms_per_part") and other.get("ms_per_part"):
            per_part = f"{step['ms_per_part'] / other['ms_per_part']:.2f}"
        rss = "-"
        if step.get("driver_peak_rss_mb") and other.get("driver_peak_rss_mb"):
            rss = f"{step['driver_peak_rss_mb'] / other['driver_peak_rss_mb']:.2f}"
        lines.append(f"| {name} | {per_row} | {per_part} | {rss} |")
    return "\n".join(lines)


def markdown(results: list[dict]) -> str:
    """Every run's table, smallest first, then the largest over the smallest of those with
    the largest's part size (a part's rows change what a step holds at once)."""
    results = sorted(results, key=lambda r: r["rows"])
    parts = [run_table(r) for r in results]
    part_rows = results[-1]["args"]["part_rows"]
    alike = [r for r in results if r["args"]["part_rows"] == part_rows]
    if len(alike) > 1:
        parts.append(ratios(alike[0], alike[-1]))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    print(markdown([json.loads(Path(p).read_text()) for p in sys.argv[1:]]), end="")
