"""FCT transformation h/g, BN freezing, schedule; SimCLR side-information and NT-Xent."""

import math

import pytest
import torch

from raycompat.fct.transformation import (
    fct_transformation,
    freeze_batchnorm_statistics,
    side_info_transformation,
    transformation_loss,
)
from raycompat.nn.side_info import SIDE_INFO, create_side_info, nt_xent_loss, simclr_views
from raycompat.train.schedule import warmup_cosine


def test_transformation_shapes_and_gradients():
    h = fct_transformation(d_old=8, d_side=4, d_new=6, width=32)
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
    h = fct_transformation(6, 0, 4, width=64)
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
    h = fct_transformation(3, 2, 5, width=8, normalize_output=True)
    out = h(torch.randn(4, 3), torch.randn(4, 2))
    torch.testing.assert_close(out.norm(dim=1), torch.ones(4))
    g = side_info_transformation(3, 2, 7, width=8)
    assert g(torch.randn(4, 3), torch.randn(4, 2)).shape == (4, 7)


def test_transformation_bad_widths():
    h = fct_transformation(3, 2, 5, width=8)
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        h(torch.randn(4, 4), torch.randn(4, 2))
    with pytest.raises(ValueError, match="side-information"):
        h(torch.randn(4, 3), None)


def test_freeze_batchnorm_statistics_keeps_running_stats():
    h = fct_transformation(3, 0, 2, width=8)
    h.train()
    freeze_batchnorm_statistics(h)
    bn = h.old_projection[1]
    before = bn.running_mean.clone()
    h(torch.randn(8, 3) + 5)
    torch.testing.assert_close(bn.running_mean, before)
    assert bn.weight.requires_grad


def test_warmup_cosine_schedule():
    assert warmup_cosine(0, 80, 5) == pytest.approx(1 / 6)
    assert warmup_cosine(5, 80, 5) == pytest.approx(1.0)
    assert warmup_cosine(80, 80, 5) == pytest.approx(0.0, abs=1e-12)
    assert warmup_cosine(42.5, 80, 5) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_nt_xent_by_hand_and_views():
    # B=2, views identical and orthogonal: each row has the twin at 1/t and two others at 0.
    z = torch.eye(2)
    t = 0.5
    expected = -math.log(math.exp(1 / t) / (math.exp(1 / t) + 2))
    assert float(nt_xent_loss(z, z, t)["loss"]) == pytest.approx(expected)
    with pytest.raises(ValueError, match="two"):
        nt_xent_loss(torch.randn(1, 3), torch.randn(1, 3))
    imgs = torch.rand(4, 3, 16, 16)
    v = simclr_views(imgs, torch.Generator().manual_seed(0))
    assert v.shape == imgs.shape and v.min() >= 0 and v.max() <= 1


@pytest.mark.parametrize("name", SIDE_INFO.names())
def test_side_info_models(name):
    psi = create_side_info(name, backbone="lenetpp", embed_dim=8)
    x = torch.rand(4, 1, 28, 28)
    out = psi.forward_features(x)
    assert out.shape == (4, psi.embed_dim)
    if name == "simclr":
        loss = nt_xent_loss(psi(simclr_views(x)), psi(simclr_views(x)))["loss"]
        loss.backward()
        assert all(p.grad is not None for p in psi.parameters())
