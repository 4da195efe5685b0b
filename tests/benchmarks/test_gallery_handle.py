"""``benchmarks/gallery_handle.py`` at toy size: its JSON names the machine, the index served,
and per clock the single-query and batch ratios against faiss with the targets' verdicts."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import benchmark_modules


@pytest.fixture(scope="module")
def bench():
    yield from benchmark_modules("gallery_handle")


def test_a_toy_run_prints_the_ratios_it_measured(bench, capsys, tmp_path):
    args = ["--rows", "300", "--width", "8", "--singles", "5", "--batch", "20", "--pairs", "2"]
    result = bench.main([*args, "--store", str(tmp_path / "store"), "--one-shot"])
    assert json.loads(capsys.readouterr().out) == result
    assert {"machine", "args", "prepare", "index", "faiss_best", "targets"} <= set(result)
    assert result["machine"]["cpu_count"] >= 1 and result["index"]["kind"] == "flat"
    assert result["index"]["served"].startswith("build ")  # the handle served the built index
    assert "faiss_as_read" not in result  # a flat build has no on-disk lists to read ahead
    for clock in ("wall", "cpu"):
        timed = result["faiss_best"][clock]
        for part in ("single_query", "batch"):
            assert timed[part]["ours_ms"] > 0 and timed[part]["baseline_ms"] > 0
            assert len(timed[part]["ratios"]) == 2 and timed[part]["ratio"] > 0
        assert set(timed["met"]) == {"single_query", "batch"}
    assert result["one_shot"]["search_ms"] > 0 and result["one_shot"]["handle_ms"] > 0
