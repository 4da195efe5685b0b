"""The "affine" kind and its fit (raycompat/transformations/fit.py): lambda = 0 is least
squares (numpy.linalg.lstsq), a larger lambda a more orthogonal W (the lambda-orthogonality
penalty of arXiv 2509.16664), a very large one Procrustes."""

from __future__ import annotations

import numpy as np
import pytest

from raycompat.transformations import (
    AffineTransformation,
    PairStatistics,
    fit_affine,
    fit_procrustes,
)


def pairs(seed: int, d_old: int = 8, d_new: int = 8, n: int = 400):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_old)) * np.linspace(0.5, 2.0, d_old) + 1.0
    y = x @ (rng.standard_normal((d_old, d_new)) * 0.4) + 0.3
    return x, y + 0.05 * rng.standard_normal((n, d_new))


def gap(fit) -> float:
    """||W^T W - I||_F on the narrower side."""
    w = fit.transformation.weight.double().numpy()
    small = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    return float(np.linalg.norm(small - np.eye(len(small))))


@pytest.mark.parametrize("d_old, d_new", [(8, 8), (8, 5), (5, 8)])
def test_lambda_zero_is_least_squares_with_an_intercept(d_old, d_new):
    x, y = pairs(0, d_old, d_new)
    fit = fit_affine(PairStatistics.of(x, y))
    assert isinstance(fit.transformation, AffineTransformation)
    solution = np.linalg.lstsq(np.hstack([x, np.ones((len(x), 1))]), y, rcond=None)[0]
    np.testing.assert_allclose(fit.transformation.weight.numpy(), solution[:-1], atol=2e-6)
    np.testing.assert_allclose(fit.transformation.bias.numpy(), solution[-1], atol=2e-6)
    least = np.mean(((x @ solution[:-1] + solution[-1] - y) ** 2).sum(1))
    assert fit.residual == pytest.approx(least, rel=1e-4)
    assert fit.info()["fit"]["lam"] == 0.0


@pytest.mark.parametrize("d_old, d_new", [(8, 8), (8, 5)])
def test_a_larger_lambda_gives_a_more_orthogonal_map_and_a_larger_residual(d_old, d_new):
    stats = PairStatistics.of(*pairs(1, d_old, d_new))
    fits = [fit_affine(stats, lam) for lam in (0.0, 0.01, 0.1, 1.0, 10.0)]
    gaps, residuals = [gap(f) for f in fits], [f.residual for f in fits]
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 0.05 * gaps[0], gaps
    assert residuals == sorted(residuals), residuals


def test_a_very_large_lambda_is_centred_procrustes():
    """On square maps ||X W - Y||^2 is tr(G) - 2 tr(W^T C) + ||Y||^2 once W is orthogonal, so
    the penalty's limit is Procrustes on the centred pairs."""
    stats = PairStatistics.of(*pairs(2))
    procrustes = fit_procrustes(stats, center=True).transformation
    affine = fit_affine(stats, 1e4).transformation
    np.testing.assert_allclose(affine.weight.numpy(), procrustes.weight.numpy(), atol=2e-3)
    np.testing.assert_allclose(affine.bias.numpy(), procrustes.bias.numpy(), atol=2e-2)


def test_a_negative_lambda_is_refused():
    with pytest.raises(ValueError, match="lam must be >= 0, got -1"):
        fit_affine(PairStatistics.of(*pairs(3)), -1)
