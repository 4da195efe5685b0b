"""benchmarks/gpu_pipeline.py on CPU (``--size tiny``): training, extraction and transform each
measured beside its ceiling through a local Ray; a failing section is recorded, not raised."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import benchmark_modules

TINY_CPU = ["--size", "tiny", "--device", "cpu"]


@pytest.fixture(scope="module")
def gpu_pipeline():
    yield from benchmark_modules("gpu_pipeline")


@pytest.mark.slow
@pytest.mark.ray
def test_tiny_cpu_run_measures_every_section(gpu_pipeline, ray_local, tmp_path):
    out = tmp_path / "gpu_pipeline.json"
    result = gpu_pipeline.main([*TINY_CPU, "--out", str(out)])

    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["device"] == "cpu" and result["machine"]["cpu_count"] >= 1
    sections = result["sections"]
    assert set(sections) == {"training", "extraction", "transform"}
    for name, entry in sections.items():
        assert "error" not in entry, f"{name}: {entry.get('traceback')}"
        assert entry["ratio"] > 0 and entry["target"] == 0.8, name
    assert result["ratios"] == {name: entry["ratio"] for name, entry in sections.items()}

    training = sections["training"]
    assert [e["epoch"] for e in training["epochs"]] == [0, 1]
    assert training["images_per_s"] == training["epochs"][1]["images_per_s"] > 0
    assert training["ceiling"]["cudnn_benchmark"]["per_s"] > 0
    assert training["config"]["scaling"]["num_workers"] == 1

    extraction = sections["extraction"]
    rates = extraction["forward_only"]["per_s"], extraction["decode"]["per_s"]
    assert min(rates) > 0 and extraction["bound_per_s"] == min(rates)
    assert extraction["pipeline"]["items"] == 40 and extraction["pipeline"]["end_to_end_per_s"] > 0

    transform = sections["transform"]
    assert transform["raw_parquet"]["rows"] == transform["pipeline"]["items"] == 1_000
    assert transform["raw_parquet"]["per_s"] > 0 and transform["compute"]["per_s"] > 0


@pytest.mark.ray
def test_a_failing_section_keeps_what_it_measured_and_the_next_runs(
    gpu_pipeline, ray_local, monkeypatch
):
    def broken(ctx, out):
        out["ceiling"] = 123.0
        raise RuntimeError("no GPU here\nsecond line")

    def working(ctx, out):
        out["ratio"] = 0.9

    monkeypatch.setattr(gpu_pipeline, "SECTIONS", {"training": broken, "extraction": working})
    result = gpu_pipeline.main(TINY_CPU)

    training = result["sections"]["training"]
    assert training["error"] == "RuntimeError: no GPU here"
    assert training["ceiling"] == 123.0 and "broken" in training["traceback"]
    assert result["ratios"] == {"training": None, "extraction": 0.9}


@pytest.mark.ray
def test_sections_past_the_budget_are_skipped(gpu_pipeline, ray_local):
    result = gpu_pipeline.main([*TINY_CPU, "--budget-s", "0"])
    assert all("skipped" in entry for entry in result["sections"].values())
    assert set(result["sections"]) == {"training", "extraction", "transform"}


def test_steady_rate_is_the_margin_between_two_runs(gpu_pipeline):
    # 100 items in 3 s, 1,100 in 5 s: the 1,000 more took 2 s whatever the fixed cost
    assert gpu_pipeline.steady_rate(100, 3.0, 1_100, 5.0) == 500.0
    assert gpu_pipeline.steady_rate(0, None, 1_100, 5.0) is None  # no small run
    assert gpu_pipeline.steady_rate(100, 6.0, 1_100, 5.0) is None  # noise: no margin left

    pipeline = {"end_to_end_per_s": 400.0, "steady_per_s": 900.0}
    assert gpu_pipeline.ratios(pipeline, 1_000.0) == {
        "end_to_end_ratio": 0.4,
        "steady_ratio": 0.9,
        "ratio_from": "steady",
        "ratio": 0.9,
        "target": 0.8,
        "meets_target": True,
    }
    pipeline["steady_per_s"] = None
    assert gpu_pipeline.ratios(pipeline, 1_000.0)["ratio"] == 0.4
