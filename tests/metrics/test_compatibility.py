"""Compatibility-matrix metrics on matrices worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raycompat.metrics import (
    CompatibilityMatrix,
    average_accuracy,
    average_accuracy_tau,
    average_compatibility,
    average_compatibility_accuracy,
    average_compatibility_accuracy_tau,
    average_compatibility_tau,
    backward_compatibility,
    compatibility_report,
    ecc,
    forward_compatibility,
    update_gain,
)

# Rows: query model t; columns: gallery model k. Cross-tests vs the self-test C[k,k]:
#   (1,0) 52 > 50 yes      (2,0) 50 = 50 TIE     (2,1) 56 > 55 yes
#   (3,0) 47 < 50 no       (3,1) 55 = 55 TIE     (3,2) 61 > 60 yes
# The 99s above the diagonal must be ignored (C is 0 there by definition).
C4 = np.array([
    [50, 99, 99, 99],
    [52, 55, 99, 99],
    [50, 56, 60, 99],
    [47, 55, 61, 62],
], dtype=float)


def test_average_compatibility_strict_and_non_strict_differ_on_ties():
    assert average_compatibility(C4) == pytest.approx(3 / 6)  # (1,0), (2,1), (3,2)
    assert average_compatibility(C4, strict=False) == pytest.approx(5 / 6)  # + both ties


def test_average_accuracy_includes_the_diagonal():
    # 50 + 52+55 + 50+56+60 + 47+55+61+62 = 548 over T(T+1)/2 = 10 entries
    assert average_accuracy(C4) == pytest.approx(54.8)


def test_average_compatibility_accuracy_sums_only_compatible_cross_tests():
    assert average_compatibility_accuracy(C4) == pytest.approx((52 + 56 + 61) / 6)
    assert average_compatibility_accuracy(C4, strict=False) == pytest.approx(
        (52 + 50 + 56 + 55 + 61) / 6)


def test_aca_is_ac_times_mean_of_compatible_entries():
    # The REFERENCE sanity check (AC 0.275, AA 48.6 -> ACA 13.6) says exactly this: ACA / AC is
    # the mean of the compatible cross-tests (13.6 / 0.275 = 49.5, close to AA).
    rng = np.random.default_rng(0)
    for _ in range(20):
        C = np.tril(rng.integers(40, 60, size=(6, 6)).astype(float))
        ac, aca = average_compatibility(C), average_compatibility_accuracy(C)
        lower = np.tri(6, k=-1, dtype=bool) & (C > np.diag(C)[None, :])
        expected = ac * C[lower].mean() if lower.any() else 0.0
        assert aca == pytest.approx(expected)


def test_tau_variants_use_the_top_left_block():
    # tau = 3: cross-tests (1,0) yes, (2,0) tie, (2,1) yes.
    assert average_compatibility_tau(C4, 3) == pytest.approx(2 / 3)
    assert average_compatibility_tau(C4, 3, strict=False) == pytest.approx(1.0)
    assert average_accuracy_tau(C4, 3) == pytest.approx((50 + 52 + 55 + 50 + 56 + 60) / 6)
    assert average_compatibility_accuracy_tau(C4, 3) == pytest.approx((52 + 56) / 3)
    assert average_compatibility_accuracy_tau(C4, 3, strict=False) == pytest.approx(
        (52 + 50 + 56) / 3)
    assert average_accuracy_tau(C4, 4) == average_accuracy(C4)
    assert average_accuracy_tau(C4, 1) == 50.0
    assert math.isnan(average_compatibility_tau(C4, 1))
    for tau in (0, 5):
        with pytest.raises(ValueError, match="tau must be in"):
            average_compatibility_tau(C4, tau)


def test_backward_and_forward_compatibility():
    # BC: last row vs each self-test: (47-50) + (55-55) + (61-60) = -2 over 3.
    assert backward_compatibility(C4) == pytest.approx(-2 / 3)
    # FC: sub-diagonal vs diagonal: (52-55) + (56-60) + (61-62) = -8 over 3.
    assert forward_compatibility(C4) == pytest.approx(-8 / 3)


def test_ecc_and_update_gain():
    assert ecc(52, 50) and not ecc(50, 50) and ecc(50, 50, strict=False) and not ecc(49, 50)
    assert ecc(0.1, 0.2, higher_is_better=False)  # error rates: lower is better
    assert update_gain(52, 50, 60) == pytest.approx(0.2)
    assert update_gain(48, 50, 60) == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="undefined"):
        update_gain(52, 50, 50)


def test_single_model_is_nan_for_cross_test_metrics():
    report = compatibility_report(np.array([[71.5]]))
    assert report["T"] == 1 and report["AA"] == 71.5
    for key in ("AC", "ACA", "BC", "FC"):
        assert math.isnan(report[key]), key


def test_report_collects_everything():
    report = compatibility_report(C4, strict=False)
    assert report == {
        "T": 4, "strict": False, "AC": pytest.approx(5 / 6), "AA": pytest.approx(54.8),
        "ACA": pytest.approx(274 / 6), "BC": pytest.approx(-2 / 3), "FC": pytest.approx(-8 / 3),
    }


def test_container_rows_and_indexing():
    cm = CompatibilityMatrix(metric="top1", higher_is_better=True)
    for t in range(4):
        cm.add_row(C4[t, : t + 1], name=f"phi_{t + 1}")
    assert len(cm) == 4 and cm.names == ["phi_1", "phi_2", "phi_3", "phi_4"]
    assert cm[3, 2] == 61 and cm[0, 3] == 0.0  # zero above the diagonal (HOC eq. 7)
    np.testing.assert_array_equal(cm.as_array(), np.tril(C4))
    assert average_compatibility(cm) == average_compatibility(C4)
    with pytest.raises(ValueError, match="row 4 needs 5 values"):
        cm.add_row([1, 2, 3])
    with pytest.raises(ValueError, match="row 4 has a non-finite value at column 2"):
        cm.add_row([1, 2, np.nan, 4, 5])
    assert len(cm) == 4  # failed rows are not appended


def test_lower_is_better_flips_the_criterion():
    errors = CompatibilityMatrix.from_array(100 - C4, metric="error", higher_is_better=False)
    assert average_compatibility(errors) == pytest.approx(3 / 6)
    assert average_compatibility(errors, strict=False) == pytest.approx(5 / 6)
    assert average_compatibility_accuracy(errors) == pytest.approx((48 + 44 + 39) / 6)
    assert average_compatibility_tau(errors, 3) == pytest.approx(2 / 3)
    # A plain array of errors is read as higher-is-better: compatible exactly where C4 is not.
    assert average_compatibility(100 - C4, strict=False) == pytest.approx(3 / 6)


def test_json_round_trip(tmp_path):
    cm = CompatibilityMatrix.from_array(C4, names=["a", "b", "c", "d"], metric="verif")
    back = CompatibilityMatrix.from_json(cm.to_json())
    np.testing.assert_array_equal(back.as_array(), cm.as_array())
    assert back.names == ["a", "b", "c", "d"] and back.metric == "verif"
    cm.save(tmp_path / "C.json")
    loaded = CompatibilityMatrix.load(tmp_path / "C.json")
    assert compatibility_report(loaded) == compatibility_report(cm)


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="square"):
        average_compatibility(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="square"):
        average_accuracy(np.zeros((0, 0)))
    bad = C4.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"C\[2, 1\] is not finite"):
        average_compatibility(bad)
    upper_nan = C4.copy()
    upper_nan[0, 3] = np.nan  # above the diagonal: ignored
    assert average_compatibility(upper_nan) == pytest.approx(0.5)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        CompatibilityMatrix.load(tmp_path / "missing.json")
    with pytest.raises(KeyError, match="rows"):
        CompatibilityMatrix.from_json('{"metric": "a", "higher_is_better": true, "names": []}')
    with pytest.raises(ValueError, match="2 names for 1 rows"):
        CompatibilityMatrix.from_json(
            '{"metric": "a", "higher_is_better": true, "names": ["x", "y"], "rows": [[1.0]]}')
    with pytest.raises(ValueError, match="3 names"):
        CompatibilityMatrix.from_array(C4, names=["a", "b", "c"])
