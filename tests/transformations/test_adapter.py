"""The "adapter" kind (raycompat/transformations/adapter.py) and fit_adapter (fit.py): a fixed
linear map plus a zero-initialised residual MLP trained a few seconds with AdamW (Drift-Adapter,
arXiv 2509.23471)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raycompat.transformations import (
    AdapterTransformation,
    PairsError,
    fit_adapter,
    fit_procrustes,
)
from raycompat.transformations.statistics import PairStatistics


def nonlinear_pairs(n: int = 1500, d_old: int = 6, d_new: int = 5):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d_old)).astype(np.float32)
    y = np.tanh(1.5 * x[:, :d_new]) + 0.3 * x[:, ::-1][:, :d_new] ** 2
    return x, y.astype(np.float32)


def test_the_adapter_leaves_less_residual_than_its_procrustes_init():
    x, y = nonlinear_pairs()
    init = fit_procrustes(PairStatistics.of(x, y))
    fit = fit_adapter(x, y, width=32, steps=300, lr=3e-3, batch_size=128)
    assert fit.settings["init"] == "procrustes" and fit.pairs == len(x)
    assert fit.settings["init_residual"] == pytest.approx(init.residual, rel=1e-5)
    assert fit.residual < 0.6 * init.residual, (fit.residual, init.residual)
    h = fit.transformation
    assert isinstance(h, AdapterTransformation) and not h.training
    torch.testing.assert_close(h.weight, init.transformation.weight)  # A stays the init


def test_the_fit_is_reproducible_from_its_seed():
    x, y = nonlinear_pairs(300)
    a, b = (fit_adapter(x, y, width=8, steps=20, seed=3) for _ in range(2))
    for (name, got), expected in zip(
        a.transformation.state_dict().items(), b.transformation.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=name)
    other = fit_adapter(x, y, width=8, steps=20, seed=4).transformation
    assert not torch.equal(other.mlp[0].weight, a.transformation.mlp[0].weight)


def test_a_fresh_adapter_is_its_linear_map():
    h = AdapterTransformation(4, 3, width=8).eval()
    old = torch.randn(5, 4)
    torch.testing.assert_close(h(old), old @ torch.eye(4, 3))
    assert h.spec() == dict(d_old=4, d_side=0, d_new=3, width=8, normalize_output=False)


def test_bad_pairs_and_an_unknown_init_are_refused():
    x, y = nonlinear_pairs(20)
    x[7, 2] = np.nan
    with pytest.raises(PairsError, match="x row 7 holds a NaN"):
        fit_adapter(x, y, steps=1)
    with pytest.raises(PairsError, match="3 pairs for widths 6 -> 5"):
        fit_adapter(x[:3], y[:3], steps=1)
    with pytest.raises(ValueError, match="unknown init 'lsq'; valid: procrustes, affine"):
        fit_adapter(x, y, init="lsq")
