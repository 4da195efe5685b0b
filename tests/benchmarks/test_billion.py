"""``benchmarks/billion.py`` at a tiny size (issue 54): the transform job is really SIGKILLed
half-way and the same command resumes it, v2 verifies, every operation runs and the working
folder is removed; too little disk is one line and exit 2, before anything is written."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import BENCHMARKS, benchmark_modules

ROWS, PART_ROWS = 40_000, 5_000  # 8 parts
# One actor and batches of 500 rows: a part takes several batches, so the kill lands
# between parts as it does at scale, not after the last one
TINY = [
    "--part-rows",
    str(PART_ROWS),
    "--actors",
    "1",
    "--batch-rows",
    "500",
    "--writers",
    "2",
    "--check-parts",
    "2",
    "--progress-s",
    "30",
]


@pytest.fixture(scope="module")
def billion():
    yield from benchmark_modules("billion")


def test_more_rows_than_the_disk_holds_is_one_line_and_exit_2(billion, tmp_path, capsys):
    root = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        billion.main(["--rows", str(10**15), "--root", str(root)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "1,000,000,000,000,000 rows need about" in err and "GB free" in err
    assert not root.exists()  # refused before anything was written


@pytest.mark.slow
@pytest.mark.ray
def test_a_tiny_run_is_killed_half_way_resumes_and_verifies(billion, tmp_path, capsys):
    root, out = tmp_path / "run", tmp_path / "billion.json"
    result = billion.main(["--rows", str(ROWS), *TINY, "--root", str(root), "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(capsys.readouterr().out) == result
    assert result["complete"]  # the file saved after each step says so only at the end
    steps = result["steps"]
    assert result["verified"] and steps["verify"]["record_rows"] == ROWS
    assert steps["verify"]["ids"] == {
        "count": ROWS,
        "min": 0,
        "max": ROWS - 1,
        "sum_ok": True,
        "dense_parts": True,
        "gaps_or_overlaps": 0,
    }
    assert len(steps["verify"]["sample"]) == 2

    transform = steps["transform"]
    first, second = transform["first_run"], transform["second_run"]
    assert first["killed"] and first["rc"] == -9  # SIGKILL, not an exit of its own
    assert 0 < transform["parts_kept"] < transform["parts_total"] == ROWS // PART_ROWS
    assert transform["parts_kept"] == first["parts_at_kill"] == first["parts_after_kill"]
    assert second["chunks_done_at_start"] == transform["parts_kept"]  # the job's own count
    assert transform["parts_kept"] + transform["parts_redone"] == transform["parts_total"]
    assert second["rc"] == 0 and second["commit_s"] > 0 and transform["time_lost_s"] > 0
    assert second["job_summary"]["rows_written"] == transform["parts_redone"] * PART_ROWS
    assert transform["status_after_kill"]["output"]["staging"][0]["parts_done"] >= 1

    for name in ("adopt", "versions", "history", "status", "validate_on_read", "gc"):
        assert steps[name]["driver_peak_rss_mb"] > 0 and steps[name]["wall_s"] > 0, name
    assert steps["adopt"]["output"]["rows"] == ROWS
    assert steps["validate_on_read"]["rows"] == ROWS
    assert steps["validate_on_read"]["sha256_changed"] == []
    assert [v["rows"] for v in steps["versions"]["output"]] == [ROWS, ROWS]
    kept = {k["what"]: k["reason"] for k in steps["gc"]["output"]["kept"]}
    assert kept["bench/v1"] == "on the lineage of v2"  # superseded, yet kept: v2 = h(v1)
    assert steps["export_delta"]["output"]["rows"] == ROWS
    assert not root.exists()  # everything it wrote is gone


def test_the_tables_in_the_docs_are_the_committed_runs():
    """docs/scale.md's billion-row tables are rendered from the committed JSON files by
    ``_billion_report.markdown``, not typed: an edited cell fails here."""
    (report,) = benchmark_modules("_billion_report")
    results_dir = BENCHMARKS / "results"
    runs = [json.loads(p.read_text()) for p in sorted(results_dir.glob("billion*_cpu.json"))]
    assert runs and all(run.get("complete") is not False and run["verified"] for run in runs)
    docs = (BENCHMARKS.parent / "docs" / "scale.md").read_text()
    tables, table = [], []
    for line in report.markdown(runs).splitlines() + [""]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            tables, table = tables + ["\n".join(table)], []
    assert len(tables) == len(runs) + (len(runs) > 1)
    missing = [t.splitlines()[2] for t in tables if t not in docs]
    assert not missing, missing


def test_the_report_renders_steps_rates_and_ratios_by_hand():
    (report,) = benchmark_modules("_billion_report")

    def run(rows: int, wall: float, mb: float, ms: float, part_rows: int = 10) -> dict:
        transform = {
            "wall_s": wall, "rows_per_s": rows / wall, "driver_peak_rss_mb": mb,
            "bytes_on_disk": 2e9, "parts_total": rows // part_rows, "parts_kept": 3,
            "parts_redone": rows // part_rows - 3, "time_lost_s": 2.0,
            "commit_ms_per_part": ms / 10, "tmp_files_left": 1, "tmp_bytes_left": 5e6,
            "first_run": {"parts_at_kill": 3, "wall_s": 1.5, "killed_processes": 4},
            "second_run": {"wall_s": 2.5, "commit_s": 0.25},
        }  # fmt: skip
        return {
            "rows": rows,
            "parts": rows // part_rows,
            "width": 8,
            "dtype": "float16",
            "args": {"part_rows": part_rows},
            "machine": {"cpu_model": "CPU", "cpu_count": 2},
            "steps": {
                "transform": transform,
                "history": {"wall_s": 1.0, "driver_peak_rss_mb": 80.0, "parts": rows // 10,
                            "ms_per_part": ms},
                "export_delta": {"skipped": "--no-export"},
            },
        }  # fmt: skip

    other_parts = run(50, 1.0, 10.0, 1.0, part_rows=5)  # another part size: not in the ratios
    text = report.markdown([run(1000, 4.0, 100.0, 20.0), run(100, 1.0, 90.0, 10.0), other_parts])
    assert "| transform | 4.0 | 0 k | 100 | - | - | 2.00 |" in text
    assert "| commit (of the transform) | 0.2 | - | - | 100 | 2.0 | - |" in text
    assert "| history | 1.0 | - | 80 | 100 | 20.0 | - |" in text
    assert (
        "Transform: SIGKILLed at 3 of 100 parts after 1.5 s (4 processes); the rerun kept 3 and "
        "wrote 97 in 2.5 s; time lost 2.0 s; the killed run left 1 temporary file(s) (5.0 MB) "
        "for gc.\nexport_delta skipped (--no-export)"
    ) in text
    # per row: 100 rows/s at 100 rows, 250 at 1000: 0.40x the time per row; RSS 100 / 90 =
    # 1.11x; the commit's 2.0 ms a part against 1.0; history 20 ms a part against 10, 80 MB both
    ratios = text[text.index("1,000 rows over 100:") :]
    assert "| transform | 0.40 | - | 1.11 |" in ratios
    assert "| commit (of the transform) | - | 2.00 | - |" in ratios
    assert "| history | - | 2.00 | 1.00 |" in ratios
    assert text.index("50 rows, 10 parts") < text.index("100 rows, 10 parts")
    assert text.index("100 rows, 10 parts") < text.index("1,000 rows, 100 parts")
