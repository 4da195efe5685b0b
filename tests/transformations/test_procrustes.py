"""The "procrustes" kind (raycompat/transformations/linear.py) and its fit (fit.py): the
orthogonal W = U V^T of the cross-covariance's SVD (Schoenemann 1966), centring, and the
semi-orthogonal W of unequal widths, which equals zero-padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raycompat.transformations import (
    PairStatistics,
    ProcrustesTransformation,
    fit_procrustes,
)


def weight_of(fit) -> np.ndarray:
    return fit.transformation.weight.double().numpy()


def test_a_hand_worked_rotation_is_recovered_exactly():
    """Rotation R by 90 degrees: (1, 0) -> (0, 1), (0, 1) -> (-1, 0). X has rows (1, 0),
    (0, 1), (1, 1), so C = X^T X R = [[2, 1], [1, 2]] R = [[-1, 2], [-2, 1]]: a symmetric
    positive definite matrix times R, whose polar factor U V^T is R itself."""
    rotation = np.array([[0.0, 1.0], [-1.0, 0.0]])
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    stats = PairStatistics.of(x, x @ rotation)
    np.testing.assert_array_equal(stats.cross, [[-1.0, 2.0], [-2.0, 1.0]])
    fit = fit_procrustes(stats)
    np.testing.assert_allclose(weight_of(fit), rotation, atol=1e-7)
    assert fit.residual == pytest.approx(0.0, abs=1e-12) and fit.pairs == 3
    with torch.inference_mode():
        out = fit.transformation(torch.tensor([[2.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.0]]))


def test_a_random_orthogonal_map_is_recovered_through_noise():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    x = rng.standard_normal((800, 16))
    y = x @ q + 0.01 * rng.standard_normal((800, 16))
    fit = fit_procrustes(PairStatistics.of(x, y, gram=False))
    w = weight_of(fit)
    np.testing.assert_allclose(w.T @ w, np.eye(16), atol=1e-6)
    assert np.abs(w - q).max() < 0.005
    assert fit.residual == pytest.approx(16 * 1e-4, rel=0.15)  # the noise's energy per pair
    assert fit.relative_residual == pytest.approx(fit.residual / np.mean((y**2).sum(1)))
    assert fit.info()["fit"]["center"] is False


def test_centring_fits_the_offset_and_the_default_does_not():
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    offset = rng.standard_normal(6) * 3
    x = rng.standard_normal((300, 6)) + 2.0
    stats = PairStatistics.of(x, x @ q + offset)
    centred = fit_procrustes(stats, center=True)
    np.testing.assert_allclose(weight_of(centred), q, atol=1e-6)
    np.testing.assert_allclose(centred.transformation.bias.numpy(), offset, atol=1e-5)
    assert centred.residual == pytest.approx(0.0, abs=1e-8)
    plain = fit_procrustes(stats)
    assert not plain.transformation.bias.any() and plain.residual > 1.0


def padded_solution(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Zero-pad both sides to the larger width, solve the square problem, keep the first
    d_new output columns (and the d_old input rows)."""
    d = max(x.shape[1], y.shape[1])
    xp = np.pad(x, ((0, 0), (0, d - x.shape[1])))
    yp = np.pad(y, ((0, 0), (0, d - y.shape[1])))
    u, _, vt = np.linalg.svd(xp.T @ yp)
    return (u @ vt)[: x.shape[1], : y.shape[1]]


@pytest.mark.parametrize("d_old, d_new", [(7, 4), (4, 7)])
def test_unequal_widths_equal_the_zero_padded_solution(d_old, d_new):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((200, d_old))
    y = x @ rng.standard_normal((d_old, d_new)) + 0.1 * rng.standard_normal((200, d_new))
    fit = fit_procrustes(PairStatistics.of(x, y))
    w = weight_of(fit)
    assert w.shape == (d_old, d_new)
    np.testing.assert_allclose(w, padded_solution(x, y), atol=1e-6)
    narrow = min(d_old, d_new)  # orthonormal columns (d_old > d_new) or rows (d_old < d_new)
    np.testing.assert_allclose(w.T @ w if d_old > d_new else w @ w.T, np.eye(narrow), atol=1e-6)
    np.testing.assert_allclose(
        fit.residual, np.mean(((x @ w - y) ** 2).sum(1)), rtol=1e-5
    )  # fmt: skip


def test_an_orthogonal_map_keeps_unit_rows_unit():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((100, 5))
    fit = fit_procrustes(PairStatistics.of(x, x @ rng.standard_normal((5, 8))))
    rows = torch.nn.functional.normalize(torch.randn(10, 5), dim=1)
    with torch.inference_mode():
        norms = fit.transformation(rows).norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(10))


def test_a_fresh_procrustes_is_the_padded_identity_and_takes_no_side_information():
    h = ProcrustesTransformation(3, 5)
    torch.testing.assert_close(h(torch.eye(3)), torch.eye(3, 5))
    with pytest.raises(ValueError, match="takes no side-information: d_side must be 0, got 2"):
        ProcrustesTransformation(3, 5, d_side=2)
    with pytest.raises(ValueError, match="takes no side-information"):
        h(torch.eye(3), torch.eye(3))
    with pytest.raises(ValueError, match=r"expected old embeddings of shape \(N, 3\)"):
        h(torch.eye(4))
