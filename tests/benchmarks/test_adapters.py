"""benchmarks/adapters.py at tiny sizes: it runs, names the machine, and its ratios are the
ratios of its own medians."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import benchmark_modules


@pytest.fixture(scope="module")
def adapters():
    yield from benchmark_modules("adapters")


def test_a_tiny_run_reports_every_number(adapters, tmp_path, capsys):
    out = tmp_path / "adapters.json"
    sizes = "--dim 16 --gallery 300 --batch 4 --repeats 50 --pairs 400 --rounds 2 --search-rounds 3"
    result = adapters.main([*sizes.split(), "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(capsys.readouterr().out) == result
    assert result["machine"]["cpu_count"] >= 1 and result["settings"]["dim"] == 16
    single = result["query_side"]["single_query"]
    assert all(single[k] > 0 for k in ("torch_addmm_us", "torch_module_us", "numpy_us"))
    assert single["search_path_meets_target"] == (single["search_path_us"] <= 10.0)
    batch = result["query_side"]["search"]["batch"]
    assert batch["added"] == pytest.approx(batch["with_map_ms"] / batch["plain_faiss_ms"] - 1)
    fit = result["fit"]
    plain = {k: fit["median_s"][k] for k in ("numpy_xty_float32", "torch_xty_float32")}
    assert fit["baseline"] == min(plain, key=plain.get)  # the faster plain product
    for name, ratio in fit["rate_ratio_to_baseline"].items():
        assert ratio == pytest.approx(min(plain.values()) / fit["median_s"][name])
    cpu = fit["median_cpu_s"]
    for name, ratio in fit["cpu_ratio_to_baseline"].items():
        assert ratio == pytest.approx(cpu[name] / cpu[fit["baseline"]])
    assert fit["procrustes_meets_target"] == (
        fit["rate_ratio_to_baseline"]["procrustes_fit"] >= 1 / 1.1
    )
