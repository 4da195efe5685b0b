"""FCT training pieces (raycompat/fct/losses.py): BN freezing; the schedule; SimCLR
side-information and NT-Xent."""

import math

import pytest
import torch

from raycompat.fct.losses import freeze_batchnorm_statistics
from raycompat.nn.side_info import SIDE_INFO, create_side_info, nt_xent_loss, simclr_views
from raycompat.train.schedule import warmup_cosine
from raycompat.transformations import FCTTransformation


def test_freeze_batchnorm_statistics_keeps_running_stats():
    h = FCTTransformation(3, 0, 2, width=8)
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
