"""Every registered backbone: forward + backward on a tiny batch, gradients reach every trainable
parameter, shapes, batch of one; plus the architectural details the papers rely on."""

from __future__ import annotations

import functools
import socket

import pytest
import torch

from raycompat.nn.backbones import BACKBONES, create_backbone
from raycompat.registry import UnknownNameError

# name -> (in_chans, image side, extra builder kwargs, native pooled width or None if fixed)
INPUTS = {
    "lenetpp": (1, 28, {}, None),
    "cifar_resnet20": (3, 32, {}, 64),
    "cifar_resnet32": (3, 32, {}, 64),
    "senet18": (3, 32, {}, 512),
    "resnet18": (3, 64, {}, 512),
    "resnet50": (3, 64, {}, 2048),
    "dinov3_vits16": (3, 32, {"img_size": 32}, 384),
    "dinov3_vitb16": (3, 32, {"img_size": 32}, 768),
}


def _inputs(name: str) -> tuple[int, int, dict, int | None]:
    if name not in INPUTS:
        pytest.fail(f"backbone {name!r} is registered but has no test input in INPUTS")
    return INPUTS[name]


class _NetworkAttempt(BaseException):
    """BaseException so that no retry loop (``except Exception``) can swallow it."""


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every backbone in this file is built with the network refused (nothing may download)."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise _NetworkAttempt(f"network access attempted: {args!r}")

    for target in ("getaddrinfo", "create_connection"):
        monkeypatch.setattr(socket, target, refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    yield attempts
    assert attempts == [], "a backbone tried to reach the network"


@functools.cache
def _built(name: str, native: bool) -> torch.nn.Module:
    """One seeded build per (backbone, width) for the whole module: ViT init is the slow part."""
    in_chans, _, kwargs, _ = _inputs(name)
    torch.manual_seed(0)
    width = {} if native else {"embed_dim": 5}
    return create_backbone(name, in_chans=in_chans, **width, **kwargs)


@pytest.mark.parametrize("name", BACKBONES.names())
def test_forward_backward_reaches_every_parameter(name):
    in_chans, side, _, _ = _inputs(name)
    model = _built(name, native=False).train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    x = torch.randn(3, in_chans, side, side)
    out = model.forward_features(x)
    assert model.embed_dim == 5
    assert out.shape == (3, 5)
    assert torch.isfinite(out).all()
    (out * torch.randn_like(out)).sum().backward()
    for pname, param in model.named_parameters():
        if param.requires_grad:
            assert param.grad is not None, f"{name}: no gradient reaches {pname}"
            assert torch.isfinite(param.grad).all(), f"{name}: non-finite gradient in {pname}"
            assert param.grad.abs().sum() > 0, f"{name}: zero gradient in {pname}"


@pytest.mark.parametrize("name", BACKBONES.names())
def test_batch_of_one_in_eval_mode(name):
    in_chans, side, _, _ = _inputs(name)
    model = _built(name, native=False).eval()
    x = torch.randn(1, in_chans, side, side)
    with torch.no_grad():
        out = model(x)
        assert torch.equal(out, model.forward_features(x))
    assert out.shape == (1, 5)
    assert torch.isfinite(out).all()


# ViT-B/16 shares every line of the ViT-S/16 path; one ViT native build keeps the file fast.
@pytest.mark.parametrize(
    "name", [n for n, v in INPUTS.items() if v[3] is not None and n != "dinov3_vitb16"])
def test_native_width_without_embedding_layer(name):
    in_chans, side, _, native = _inputs(name)
    model = _built(name, native=True).eval()
    assert model.embed_dim == native
    with torch.no_grad():
        assert model(torch.randn(2, in_chans, side, side)).shape == (2, native)


@pytest.mark.parametrize("name, millions", [("cifar_resnet20", 0.27), ("cifar_resnet32", 0.46)])
def test_cifar_resnet_parameter_counts_match_cores(name, millions):
    # CoReS Sec. 8.5 quotes 0.27M and 0.46M parameters: option-A (parameter-free) shortcuts.
    model = create_backbone(name)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == millions
    option_b = create_backbone(name, shortcut="B")
    assert sum(p.numel() for p in option_b.parameters()) > sum(
        p.numel() for p in model.parameters())


def test_option_a_shortcut_subsamples_and_zero_pads():
    from raycompat.nn.backbones.cifar_resnet import _ZeroPadShortcut

    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(1, 2, 4, 4)
    out = _ZeroPadShortcut(2, 4, stride=2)(x)
    assert out.shape == (1, 4, 2, 2)
    assert torch.equal(out[:, :2], torch.tensor([[[[0.0, 2], [8, 10]], [[16, 18], [24, 26]]]]))
    assert torch.equal(out[:, 2:], torch.zeros(1, 2, 2, 2))


def test_squeeze_excite_rescales_each_channel_by_a_gate_in_0_1():
    from raycompat.nn.backbones.senet import SqueezeExcite

    torch.manual_seed(0)
    x = torch.rand(2, 32, 5, 5) + 0.1
    gate = SqueezeExcite(32, reduction=16)(x) / x
    assert torch.allclose(gate, gate[:, :, :1, :1].expand_as(gate))  # one gate per channel
    assert (gate > 0).all() and (gate < 1).all()


def test_senet18_post_activation_variant_runs():
    model = create_backbone("senet18", embed_dim=3, preact=False, base_width=8).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)


def test_resnet50_at_112_in_channels_last_matches_contiguous():
    torch.manual_seed(0)
    model = create_backbone("resnet50", embed_dim=8).eval()
    x = torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        ref = model(x)
        model = model.to(memory_format=torch.channels_last)
        out = model(x.contiguous(memory_format=torch.channels_last))
    assert out.shape == (2, 8)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_dinov3_feature_is_the_final_norm_cls_token():
    model = _built("dinov3_vits16", native=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), model.trunk.forward_features(x)[:, 0])
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 384)  # RoPE: other sizes work


@pytest.mark.parametrize("name, kwargs, match", [
    ("cifar_resnet20", {"shortcut": "C"}, "shortcut must be 'A' or 'B'"),
    ("dinov3_vits16", {"img_size": 30}, "multiple of the patch size 16"),
])
def test_bad_options_raise_clear_errors(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        create_backbone(name, **kwargs)


def test_bad_depth_and_unknown_names():
    from raycompat.nn.backbones.cifar_resnet import CifarResNet

    with pytest.raises(ValueError, match="6n\\+2"):
        CifarResNet(21)
    with pytest.raises(UnknownNameError, match="cifar_resnet20.*senet18"):
        create_backbone("resnet20")
