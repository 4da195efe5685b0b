"""``benchmarks/billion.py`` at a tiny size (issue 54): the transform job is really SIGKILLed
half-way and the same command resumes it, v2 verifies, every operation runs and the working
folder is removed; too little disk is one line and exit 2, before anything is written."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import benchmark_modules

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
