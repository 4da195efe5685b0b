"""The fit's sufficient statistics (raycompat/transformations/statistics.py) and the checks of
paired rows (pairs.py): parts merge into the statistics of their concatenation, the residual
comes from the statistics alone, and every bad input is one line naming the row."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.errors import DataError
from raycompat.transformations import (
    PairsError,
    PairStatistics,
    check_pairs,
    fit_affine,
    fit_procrustes,
)
from raycompat.transformations.statistics import BLOCK_ROWS

FIELDS = ("sum_x", "sum_y", "sum_sq_x", "sum_sq_y", "cross", "gram")


def naive(x: np.ndarray, y: np.ndarray) -> dict:
    """The statistics written out in float64, all rows at once."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    return dict(
        sum_x=x.sum(0), sum_y=y.sum(0), sum_sq_x=(x**2).sum(), sum_sq_y=(y**2).sum(),
        cross=x.T @ y, gram=x.T @ x,
    )  # fmt: skip


def assert_statistics(stats: PairStatistics, expected: dict, count: int, **tolerance) -> None:
    assert stats.count == count
    for name in FIELDS:
        np.testing.assert_allclose(getattr(stats, name), expected[name], err_msg=name, **tolerance)


def parts(x, y, bounds):
    return [PairStatistics.of(x[a:b], y[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]


def test_merged_parts_equal_the_concatenation_bit_for_bit_on_exact_values():
    """Small integers: every sum is exact in float32 and float64, so any grouping is equal."""
    rng = np.random.default_rng(0)
    x = rng.integers(-8, 8, (300, 5)).astype(np.float32)
    y = rng.integers(-8, 8, (300, 3)).astype(np.float32)
    a, b, c = parts(x, y, [0, 70, 71, 300])
    for merged in (a.merge(b).merge(c), a.merge(b.merge(c)), c.merge(a).merge(b)):
        assert_statistics(merged, naive(x, y), 300, rtol=0, atol=0)


def test_merged_parts_are_close_to_the_naive_reference_and_associative():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((500, 6)), rng.standard_normal((500, 4))
    a, b, c = parts(x, y, [0, 123, 400, 500])
    left, right = a.merge(b).merge(c), a.merge(b.merge(c))
    assert_statistics(left, naive(x, y), 500, rtol=1e-12, atol=1e-12)
    assert_statistics(right, {f: getattr(left, f) for f in FIELDS}, 500, rtol=1e-13, atol=1e-13)
    added = PairStatistics.empty(6, 4).add(x[:123], y[:123]).add(x[123:], y[123:])
    assert_statistics(added, naive(x, y), 500, rtol=1e-12, atol=1e-12)


def test_float32_rows_are_multiplied_per_block_and_summed_in_float64():
    rng = np.random.default_rng(2)
    n = BLOCK_ROWS * 2 + 5  # three blocks
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = rng.standard_normal((n, 3)).astype(np.float32)
    stats = PairStatistics.of(x, y)
    assert stats.cross.dtype == np.float64 and stats.gram.dtype == np.float64
    assert_statistics(stats, naive(x, y), n, rtol=1e-5, atol=1e-2)


def test_without_the_gram_only_the_affine_fit_is_refused():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((40, 4)), rng.standard_normal((40, 4))
    stats = PairStatistics.of(x, y, gram=False)
    assert stats.gram is None and not stats.has_gram
    fit_procrustes(stats)
    with pytest.raises(PairsError, match="kept without the Gram"):
        fit_affine(stats)
    with pytest.raises(PairsError, match="with and without the Gram"):
        stats.merge(PairStatistics.of(x, y))
    with pytest.raises(PairsError, match="widths 4 -> 4 with 4 -> 3"):
        stats.merge(PairStatistics.empty(4, 3, gram=False))


def test_without_the_column_sums_the_uncentred_procrustes_fit_is_the_same():
    """``sums=False`` (what ``fit_kind("procrustes", ...)`` keeps: one read of the rows fewer)
    gives the same map, residual and target energy as the full statistics; what needs the sums
    (a centred fit, the affine fit, the residual of a bias, a merge with sums) is refused."""
    from raycompat.transformations import fit_kind

    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 6)).astype(np.float32)
    y = (x @ np.linalg.qr(rng.standard_normal((6, 6)))[0]).astype(np.float32) + 0.1
    full = PairStatistics.of(x, y, gram=False)
    lean = PairStatistics.of(x, y, gram=False, sums=False)
    assert lean.sum_x is None and lean.sum_y is None and not lean.has_sums and full.has_sums
    for name in ("sum_sq_x", "sum_sq_y", "cross"):
        np.testing.assert_array_equal(getattr(lean, name), getattr(full, name), err_msg=name)
    expected, fitted = fit_procrustes(full), fit_kind("procrustes", x, y)
    weight = fitted.transformation.weight.numpy()
    np.testing.assert_array_equal(weight, expected.transformation.weight.numpy())
    assert fitted.residual == expected.residual and fitted.target_energy == expected.target_energy
    rows = np.mean(((x.astype(np.float64) @ weight - y) ** 2).sum(1))
    assert fitted.residual == pytest.approx(rows, rel=1e-4)  # float32 products, then cancelling
    with pytest.raises(PairsError, match="centred procrustes fit: .* without column sums"):
        fit_procrustes(lean, center=True)
    with pytest.raises(PairsError, match="affine fit: .* without column sums"):
        fit_affine(PairStatistics.of(x, y, sums=False))
    with pytest.raises(PairsError, match="with and without column sums"):
        lean.merge(full)
    assert lean.mean_squared_residual(weight, np.ones(6)) is None  # a bias needs the sums
    merged = lean.merge(PairStatistics.of(x, y, gram=False, sums=False))
    assert merged.count == 600 and not merged.has_sums


@pytest.mark.parametrize("gram", [True, False])
def test_the_residual_from_the_statistics_is_the_residual_of_the_rows(gram):
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((200, 5)), rng.standard_normal((200, 7))
    stats = PairStatistics.of(x, y, gram=gram)
    q, _ = np.linalg.qr(rng.standard_normal((7, 5)))
    weight, bias = q.T, rng.standard_normal(7)  # orthonormal rows (d_old 5 <= d_new 7)
    expected = np.mean(((x @ weight + bias - y) ** 2).sum(1))
    assert stats.mean_squared_residual(weight, bias) == pytest.approx(expected, rel=1e-10)
    general = rng.standard_normal((5, 7))
    got = stats.mean_squared_residual(general, bias)
    if gram:
        assert got == pytest.approx(np.mean(((x @ general + bias - y) ** 2).sum(1)), rel=1e-10)
    else:
        assert got is None  # needs X^T X


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, DataError)
    return message


def test_lengths_that_differ_are_named():
    with pytest.raises(PairsError) as err:
        check_pairs(np.zeros((5, 2)), np.zeros((4, 2)), where="part-3")
    assert one_line(err) == "part-3: 5 rows of x but 4 rows of y; pairs are row by row"


def test_ids_that_do_not_pair_up_name_the_first_row():
    ids = np.arange(10, 15)
    with pytest.raises(PairsError) as err:
        check_pairs(np.zeros((5, 2)), np.zeros((5, 2)), x_ids=ids, y_ids=ids[[0, 1, 3, 2, 4]])
    assert one_line(err) == (
        "pairs: ids do not pair up at row 2: x has id 12, y has id 13 (2 rows differ)"
    )
    with pytest.raises(PairsError, match="ids given for one side only"):
        check_pairs(np.zeros((5, 2)), np.zeros((5, 2)), x_ids=ids)
    with pytest.raises(PairsError, match="4 x ids and 5 y ids for 5 pairs"):
        check_pairs(np.zeros((5, 2)), np.zeros((5, 2)), x_ids=ids[:4], y_ids=ids)


@pytest.mark.parametrize("side, value", [("x", np.nan), ("y", np.inf)])
def test_a_nan_or_an_infinity_names_its_row_and_id(side, value):
    x, y = np.zeros((6, 3)), np.zeros((6, 2))
    (x if side == "x" else y)[4, 1] = value
    with pytest.raises(PairsError) as err:
        check_pairs(x, y, x_ids=np.arange(100, 106), y_ids=np.arange(100, 106), where="p.parquet")
    assert one_line(err) == (
        f"p.parquet: {side} row 4 (id 104) holds a NaN or an infinity (1 such rows)"
    )


def test_a_nan_in_a_later_block_is_named_by_its_row_in_the_part():
    """The per-block sums of squares find the block; the rows are then searched to name it."""
    n = BLOCK_ROWS + 10
    x, y = np.ones((n, 2), np.float32), np.ones((n, 2), np.float32)
    y[BLOCK_ROWS + 3, 0] = -np.inf
    y[BLOCK_ROWS + 7, 1] = np.nan
    with pytest.raises(PairsError) as err:
        PairStatistics.of(x, y, where="part-2")
    assert one_line(err) == (
        f"part-2: y row {BLOCK_ROWS + 3} holds a NaN or an infinity (2 such rows)"
    )


def test_finite_rows_whose_float32_sum_of_squares_overflows_are_summed_in_float64():
    x = np.zeros((4, 2), np.float32)
    x[:, 0] = 1e19  # each row's square 1e38 is a float32; their sum 4e38 is not
    stats = PairStatistics.of(x, np.ones((4, 2), np.float32))
    assert stats.sum_sq_x == pytest.approx(4e38, rel=1e-6)
    np.testing.assert_allclose(stats.cross, [[4e19, 4e19], [0, 0]], rtol=1e-6)


def test_a_refused_part_changes_nothing():
    stats = PairStatistics.of(np.ones((3, 2)), np.ones((3, 2)))
    before = {f: np.copy(getattr(stats, f)) for f in FIELDS}
    bad = np.ones((4, 2))
    bad[3, 0] = np.nan
    with pytest.raises(PairsError, match="x row 3 holds a NaN"):
        stats.add(bad, np.ones((4, 2)))
    with pytest.raises(PairsError, match="widths 3 -> 2, but these statistics are 2 -> 2"):
        stats.add(np.ones((4, 3)), np.ones((4, 2)))
    with pytest.raises(PairsError, match=r"x is 1-d of shape \(4,\), not \(N, d\)"):
        stats.add(np.ones(4), np.ones((4, 2)))
    assert stats.count == 3
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(stats, name), before[name])


@pytest.mark.parametrize("fit", [fit_procrustes, fit_affine])
def test_fewer_pairs_than_the_width_are_refused(fit):
    stats = PairStatistics.of(np.ones((5, 8)), np.ones((5, 6)))
    with pytest.raises(PairsError) as err:
        fit(stats)
    kind = fit.__name__.removeprefix("fit_")
    assert one_line(err) == (
        f"{kind} fit: 5 pairs for widths 8 -> 6; it needs at least 8 (the larger width), "
        "or the map is not determined by the pairs"
    )


@pytest.mark.parametrize("kind", ["procrustes", "affine", "adapter", "slerp"])
def test_fit_kind_is_each_fit_with_its_settings(kind):
    """``fit_kind``: the one entry of ``raycompat adapt`` and the job's map methods; a
    Procrustes map onto fewer coordinates keeps the Gram, so its residual is still known."""
    from raycompat.transformations import fit_kind

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y = (x @ rng.standard_normal((6, 4))).astype(np.float32)
    fit = fit_kind(kind, x, y, lam=0.1, seed=3, where="p")
    assert fit.transformation.kind == kind and fit.pairs == 64
    assert fit.residual is not None  # 6 -> 4: not an isometry, answered from the Gram
    expected = {"affine": ("lam", 0.1), "adapter": ("seed", 3), "slerp": ("grid", 21)}
    assert expected.get(kind, ("center", False)) in fit.settings.items()
    with pytest.raises(ValueError, match="fit_kind: 'fct' is not one of"):
        fit_kind("fct", x, y)


def test_fit_statistics_fits_merged_parts_as_fit_kind_fits_their_rows():
    """The job fits its linear maps from statistics merged over workers: the same map as the
    rows in memory give; the adapter needs the rows, and says so."""
    from raycompat.transformations import fit_kind, fit_statistics

    rng = np.random.default_rng(1)
    x = rng.standard_normal((80, 5))
    y = x @ rng.standard_normal((5, 5)) + 0.01 * rng.standard_normal((80, 5))
    merged = PairStatistics.of(x[:30], y[:30]).merge(PairStatistics.of(x[30:], y[30:]))
    for kind in ("procrustes", "affine"):
        whole, parts = fit_kind(kind, x, y, lam=0.2), fit_statistics(kind, merged, lam=0.2)
        np.testing.assert_allclose(
            parts.transformation.weight.detach().numpy(),
            whole.transformation.weight.detach().numpy(),
            atol=1e-6,
        )
        assert parts.pairs == 80 and parts.residual == pytest.approx(whole.residual)
    with pytest.raises(ValueError, match="'adapter' is not fitted from statistics"):
        fit_statistics("adapter", merged)
