"""The "fct" kind (raycompat/transformations/fct.py): FCT's h and g MLP, shapes, gradients,
normalised output, width errors, its spec."""

import pytest
import torch

from raycompat.fct.losses import transformation_loss
from raycompat.transformations import (
    FCTTransformation,
    create_transformation,
    side_info_transformation,
)


def test_transformation_shapes_and_gradients():
    h = FCTTransformation(d_old=8, d_side=4, d_new=6, width=32)
    old, side = torch.randn(16, 8), torch.randn(16, 4)
    out = h(old, side)
    assert out.shape == (16, 6)
    transformation_loss(out, torch.randn(16, 6))["loss"].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in h.parameters())


def test_transformation_learns_a_linear_map():
    torch.manual_seed(0)
    a = torch.randn(6, 4)
    old = torch.randn(512, 6)
    target = old @ a
    h = FCTTransformation(6, 0, 4, width=64)
    opt = torch.optim.Adam(h.parameters(), lr=1e-2)
    first = None
    for _ in range(200):
        loss = transformation_loss(h(old), target)["loss"]
        first = first if first is not None else float(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < 0.1 * first


def test_normalized_output_and_g():
    h = FCTTransformation(3, 2, 5, width=8, normalize_output=True)
    out = h(torch.randn(4, 3), torch.randn(4, 2))
    torch.testing.assert_close(out.norm(dim=1), torch.ones(4))
    g = side_info_transformation(3, 2, 7, width=8)
    assert g(torch.randn(4, 3), torch.randn(4, 2)).shape == (4, 7)


def test_transformation_bad_widths():
    h = FCTTransformation(3, 2, 5, width=8)
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        h(torch.randn(4, 4), torch.randn(4, 2))
    with pytest.raises(ValueError, match="side-information"):
        h(torch.randn(4, 3), None)


@pytest.mark.parametrize("uncertainty", [False, True])
def test_spec_rebuilds_the_same_shape_and_reports_the_head(uncertainty):
    h = FCTTransformation(6, 3, 4, width=16, normalize_output=True, uncertainty=uncertainty)
    spec = h.spec()
    assert spec == dict(
        d_old=6, d_side=3, d_new=4, width=16, normalize_output=True, uncertainty=uncertainty
    )
    rebuilt = create_transformation("fct", **spec)
    assert isinstance(rebuilt, FCTTransformation) and rebuilt.has_uncertainty is uncertainty
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
        k: v.shape for k, v in h.state_dict().items()
    }


def test_forward_with_uncertainty_needs_the_head():
    with pytest.raises(ValueError, match="uncertainty=True"):
        FCTTransformation(3, 0, 2, width=8).forward_with_uncertainty(torch.randn(4, 3))
