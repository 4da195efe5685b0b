"""The "slerp" kind (raycompat/transformations/slerp.py) and its fit (slerp_fit.py): a
Procrustes map, then spherical interpolation toward the input read in the target space, alpha
chosen on held-out support pairs (Ricci, Biondi, Pernici, NeurIPS 2026)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raycompat.transformations import (
    SlerpTransformation,
    fit_kind,
    fit_slerp,
    load_transformation,
    save_transformation,
    spherical_interpolation,
)


def test_the_ends_the_midpoint_and_unit_rows_by_hand():
    u, v = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 2.0, 0.0]])  # v not unit
    torch.testing.assert_close(spherical_interpolation(u, v, 0.0), u)
    torch.testing.assert_close(spherical_interpolation(u, v, 1.0), v / 2)
    half = math.sqrt(0.5)
    torch.testing.assert_close(
        spherical_interpolation(u, v, 0.5), torch.tensor([[half, half, 0.0]])
    )
    third = spherical_interpolation(u, v, 1 / 3)  # 30 degrees along a 90-degree arc
    torch.testing.assert_close(third, torch.tensor([[math.cos(math.pi / 6), 0.5, 0.0]]))
    rows = spherical_interpolation(torch.randn(7, 5), torch.randn(7, 5), 0.3)
    torch.testing.assert_close(rows.norm(dim=1), torch.ones(7))
    same = torch.tensor([[0.6, 0.8]])
    torch.testing.assert_close(spherical_interpolation(same, same, 0.4), same)  # theta = 0


def test_a_fresh_map_reads_the_input_in_the_target_space_and_refuses_raw_output():
    h = SlerpTransformation(4, 3).eval()
    old = torch.tensor([[3.0, 0.0, 4.0, 0.0]])
    torch.testing.assert_close(h(old), torch.tensor([[0.6, 0.0, 0.8]]))
    assert h.spec() == dict(d_old=4, d_side=0, d_new=3, normalize_output=True)
    with pytest.raises(ValueError, match="unit rows: normalize_output"):
        SlerpTransformation(4, 3, normalize_output=False)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        h.set_alpha(1.5)


def shared_coordinates(n: int, d: int, share: float, seed: int = 0):
    """Pairs whose target is the input turned by ``share`` of a random rotation, plus noise: a
    fine-tuned model still sharing coordinates with its predecessor."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    x = rng.standard_normal((n, d))
    y = (1 - share) * x + share * x @ q + 0.6 * rng.standard_normal((n, d))
    return x.astype(np.float32), y.astype(np.float32)


def test_the_fit_picks_procrustes_alone_between_unrelated_spaces():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((400, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # unit rows: the map's output is unit rows
    q, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    fit = fit_kind("slerp", x, (x @ q).astype(np.float32), seed=1)
    h, s = fit.transformation, fit.settings
    assert s["alpha"] == 1.0 and s["held_out_top1"] == 1.0 and s["held_out_pairs"] == 80
    np.testing.assert_allclose(h.weight.numpy(), q, atol=1e-5)  # R = the rotation
    assert fit.relative_residual < 1e-9


def test_the_fit_moves_inside_the_arc_where_the_spaces_share_coordinates():
    """A small support set and a target mostly the input: Procrustes alone is noisy, the
    chosen interior alpha retrieves at least as well on the held-out pairs and better on pairs
    it never saw."""
    x, y = shared_coordinates(3000, 24, 0.3)
    fit = fit_slerp(x[:100], y[:100], seed=0)
    s = fit.settings
    assert 0.0 < s["alpha"] < 1.0 and s["held_out_top1"] >= s["procrustes_held_out_top1"]
    h = fit.transformation
    alone = SlerpTransformation(24, 24)
    alone.set_weights(h.weight, torch.zeros(24))
    test_x, test_y = (
        torch.from_numpy(x[100:1100]),
        torch.nn.functional.normalize(torch.from_numpy(y[100:1100])),
    )

    def top1(m) -> float:
        with torch.inference_mode():
            return float(
                (torch.argmax(m(test_x) @ test_y.T, 1) == torch.arange(1000)).float().mean()
            )

    assert top1(h) > top1(alone), (top1(h), top1(alone))


def test_a_save_load_round_trip_keeps_alpha(tmp_path):
    x, y = shared_coordinates(120, 6, 0.5)
    fit = fit_slerp(x, y, seed=0)
    save_transformation(tmp_path, fit.transformation, "h", **fit.info())
    loaded = load_transformation(tmp_path)
    assert isinstance(loaded, SlerpTransformation) and float(loaded.alpha) == pytest.approx(
        fit.settings["alpha"]
    )
    old = torch.randn(5, 6)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(old), fit.transformation(old), rtol=0, atol=0)
