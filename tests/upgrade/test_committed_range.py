"""raycompat.upgrade.committed_range: the run's cells lined up against the committed
multi-seed range, only where the benchmark trains the same pair the same way."""

from __future__ import annotations

import json

from raycompat.config import load_config
from raycompat.config.upgrade import UpgradeConfig
from raycompat.upgrade.committed_range import committed_lines, compare, protocol_key
from raycompat.upgrade.report import Outcome


def cell(low, high):
    return {"mean": (low + high) / 2, "sd": 1.0, "min": low, "max": high, "n": 3}


def matrix(n, low, high):
    return [[cell(low, high) if k <= t else None for k in range(n)] for t in range(n)]


RESULTS = {
    "config": {"seeds": [0, 1, 2]},
    "protocols": {"mnist5k/open_set": {"methods": {
        "dsimplex_hoc": {"summary": {"matrix": matrix(3, 40.0, 50.0)}},
        "ift": {"summary": {"matrix": matrix(3, 30.0, 35.0)}},
        "independent": {"summary": {"matrix": matrix(3, 55.0, 65.0)}},
    }}},
}


def evidence(against, cross, old_self, new_self):
    return {"against": against, "cross": cross, "old_self": old_self, "new_self": new_self}


def outcomes():
    return [
        Outcome("m1", "independent", 5, "initial", ""),
        Outcome("m2", "dsimplex_hoc", 6, "refuse", "", against="m1",
                evidence={"direct": evidence("m1", 0.45, 0.60, 0.70)},
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
    cross = got["M(m2, m1)", "dsimplex_hoc"]
    assert (cross.value, cross.low, cross.high, cross.inside) == (45.0, 40.0, 50.0, True)
    self_test = got["M(m1, m1)", "dsimplex_hoc"]  # 60 against [40, 50]
    assert not self_test.inside and "above" in self_test.line()
    assert got["M(ift (m2's baseline), m1)", "ift"].inside  # 33 in [30, 35]
    assert "below" in got["M(ift (m2's baseline), ift (m2's baseline))", "ift"].line()  # 20


def test_lines_say_why_nothing_is_compared(tmp_path):
    missing = committed_lines(outcomes(), UpgradeConfig(), tmp_path / "none.json")
    assert missing == [f"no committed multi-seed range to compare with ({tmp_path / 'none.json'} "
                       "is not here)"]
    path = tmp_path / "fidelity_cpu.json"
    path.write_text(json.dumps(RESULTS))
    closed = load_config(UpgradeConfig, "configs/upgrade_mnist_closed.yaml", [])
    assert "no committed multi-seed range for this config" in committed_lines([], closed, path)[0]
    lines = committed_lines(outcomes(), UpgradeConfig(), path)
    assert lines[0].startswith("this run against the committed range of 3 seeds")
    assert "M(m2, m1) = 45.00: inside the committed range [40.00, 50.00]" in lines[1]
