"""raycompat.upgrade.committed_range: the run's cells lined up against the 95% prediction
interval of the committed seeds, only where the benchmark trains the same pair the same way.
Five seeds with sd 1: half-width t(0.975, 4) sqrt(1.2) = 3.041443."""

from __future__ import annotations

import json

import pytest

from raycompat.config import load_config
from raycompat.config.upgrade import UpgradeConfig
from raycompat.upgrade.committed_range import committed_lines, compare, protocol_key
from raycompat.upgrade.report import Outcome


def cell(mean, low, high):
    return {"mean": mean, "sd": 1.0, "min": low, "max": high, "n": 5}


def matrix(n, mean, low, high):
    return [[cell(mean, low, high) if k <= t else None for k in range(n)] for t in range(n)]


RESULTS = {
    "config": {"seeds": [0, 1, 2, 3, 4]},
    "protocols": {"mnist5k/open_set": {"methods": {
        "dsimplex_hoc": {"summary": {"matrix": matrix(3, 45.0, 44.0, 46.5)}},
        "ift": {"summary": {"matrix": matrix(3, 32.5, 31.0, 34.0)}},
        "independent": {"summary": {"matrix": matrix(3, 60.0, 58.0, 61.0)}},
    }}},
}
HALF = 3.041443


def evidence(against, cross, old_self, new_self):
    return {"against": against, "cross": cross, "old_self": old_self, "new_self": new_self}


def outcomes():
    return [
        Outcome("m1", "independent", 5, "initial", ""),
        Outcome("m2", "dsimplex_hoc", 6, "refuse", "", against="m1",
                evidence={"direct": evidence("m1", 0.47, 0.60, 0.70)},
                baselines={"ift": evidence("m1", 0.33, 0.60, 0.20)}),
        # m3 against m2 (as if m2 had been published): no counterpart, skipped
        Outcome("m3", "fct", 7, "transform", "", against="m2",
                evidence={"direct": evidence("m2", 0.5, 0.6, 0.9)}),
    ]


def test_default_config_is_the_benchmark_protocol_and_closed_set_is_not():
    assert protocol_key(UpgradeConfig()) == "mnist5k/open_set"
    assert protocol_key(load_config(UpgradeConfig, "configs/upgrade_mnist.yaml", [])) == (
        "mnist5k/open_set"
    )
    assert protocol_key(load_config(UpgradeConfig, "configs/upgrade_mnist_closed.yaml", [])) is None
    assert protocol_key(load_config(UpgradeConfig, None, ["training.epochs=3"])) is None


def test_cells_against_the_first_model_are_compared_in_percent():
    got = {(c.label, c.method): c for c in compare(outcomes(), UpgradeConfig(), RESULTS)}
    assert set(got) == {
        ("M(m2, m1)", "dsimplex_hoc"), ("M(m1, m1)", "dsimplex_hoc"), ("M(m2, m2)", "dsimplex_hoc"),
        ("M(ift (m2's baseline), m1)", "ift"), ("M(m1, m1)", "ift"),
        ("M(ift (m2's baseline), ift (m2's baseline))", "ift"),
    }
    cross = got["M(m2, m1)", "dsimplex_hoc"]  # 47: above the seeds' max, inside the interval
    assert (cross.value, cross.seeds_max, cross.inside) == (47.0, 46.5, True)
    assert (cross.low, cross.high) == pytest.approx((45 - HALF, 45 + HALF), abs=1e-5)
    self_test = got["M(m1, m1)", "dsimplex_hoc"]  # 60 against [41.96, 48.04]
    assert not self_test.inside and "above" in self_test.line()
    assert got["M(ift (m2's baseline), m1)", "ift"].inside  # 33 in [29.46, 35.54]
    assert "below" in got["M(ift (m2's baseline), ift (m2's baseline))", "ift"].line()  # 20


def test_a_cell_of_one_seed_is_not_compared_and_intervals_stay_within_0_and_100():
    results = json.loads(json.dumps(RESULTS))
    methods = results["protocols"]["mnist5k/open_set"]["methods"]
    for row in methods["dsimplex_hoc"]["summary"]["matrix"]:
        for c in filter(None, row):
            c.update(sd=None, n=1)
    for row in methods["ift"]["summary"]["matrix"]:
        for c in filter(None, row):
            c.update(sd=40.0)
    got = compare(outcomes(), UpgradeConfig(), results)
    assert got and {c.method for c in got} == {"ift"}
    assert all((c.low, c.high) == (0.0, 100.0) for c in got)


def test_lines_say_why_nothing_is_compared(tmp_path):
    missing = committed_lines(outcomes(), UpgradeConfig(), tmp_path / "none.json")
    assert missing == [f"no committed multi-seed range to compare with ({tmp_path / 'none.json'} "
                       "is not here)"]
    path = tmp_path / "fidelity_cpu.json"
    path.write_text(json.dumps(RESULTS))
    closed = load_config(UpgradeConfig, "configs/upgrade_mnist_closed.yaml", [])
    assert "no committed multi-seed range for this config" in committed_lines([], closed, path)[0]
    lines = committed_lines(outcomes(), UpgradeConfig(), path)
    assert lines[0].startswith("this run against the committed results of 5 seeds")
    assert lines[1] == (
        "M(m2, m1) = 47.00: inside the 95% prediction interval [41.96, 48.04] of 5 seeds "
        "(mean 45.00, seeds 44.00-46.50; dsimplex_hoc)"
    )
