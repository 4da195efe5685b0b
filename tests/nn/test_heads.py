"""d-Simplex geometry, closed-form logits, label allocation, head registry."""

import math

import pytest
import torch

from raycompat.nn.heads import (
    HEADS,
    allocate_labels,
    create_head,
    dsimplex_logits,
    dsimplex_prototypes,
    polygon_prototypes,
)
from raycompat.registry import UnknownNameError


@pytest.mark.parametrize("k", [2, 3, 4, 10, 100, 257])
def test_simplex_geometry(k):
    w = dsimplex_prototypes(k, dtype=torch.float64)
    assert w.shape == (k, k - 1)
    torch.testing.assert_close(w.norm(dim=1), torch.ones(k, dtype=torch.float64))
    gram = w @ w.T
    expected = torch.full((k, k), -1.0 / (k - 1), dtype=torch.float64)
    expected.fill_diagonal_(1.0)
    torch.testing.assert_close(gram, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        w.sum(dim=0), torch.zeros(k - 1, dtype=torch.float64), atol=1e-12, rtol=0
    )


def test_simplex_k3_by_hand():
    # K=3: an equilateral triangle in 2-D, every angle 120 degrees.
    w = dsimplex_prototypes(3, dtype=torch.float64)
    for i in range(3):
        for j in range(i + 1, 3):
            angle = math.degrees(math.acos(float(w[i] @ w[j])))
            assert angle == pytest.approx(120.0)


@pytest.mark.parametrize("k", [2, 5, 10, 100, 1000])
def test_closed_form_equals_dense(k):
    g = torch.Generator().manual_seed(k)
    f = torch.randn(7, k - 1, generator=g, dtype=torch.float64)
    dense = f @ dsimplex_prototypes(k, dtype=torch.float64).T
    torch.testing.assert_close(dsimplex_logits(f, k), dense, atol=1e-10, rtol=1e-10)


def test_closed_form_head_matches_dense_head_and_gets_no_gradient():
    k = 50
    closed = create_head("dsimplex", feature_dim=k - 1, num_classes=k)
    dense = create_head("dsimplex", feature_dim=k - 1, num_classes=k, closed_form=False)
    f = torch.randn(4, k - 1, requires_grad=True)
    torch.testing.assert_close(closed(f), dense(f), atol=1e-5, rtol=1e-5)
    assert list(closed.parameters()) == [] and list(dense.parameters()) == []
    closed(f).sum().backward()
    assert f.grad is not None


def test_closed_form_batch_of_one():
    assert dsimplex_logits(torch.randn(1, 9), 10).shape == (1, 10)


def test_polygon_prototypes():
    w = polygon_prototypes(10, dtype=torch.float64)
    torch.testing.assert_close(w.norm(dim=1), torch.ones(10, dtype=torch.float64))
    torch.testing.assert_close(
        w[0] @ w[1], torch.tensor(math.cos(2 * math.pi / 10), dtype=torch.float64)
    )


def test_label_allocation():
    y = torch.tensor([0, 1, 4])
    assert allocate_labels(y, 5, "ltr").tolist() == [0, 1, 4]
    assert allocate_labels(y, 5, "rtl").tolist() == [4, 3, 0]
    with pytest.raises(ValueError, match="K=4"):
        allocate_labels(y, 4, "ltr")
    with pytest.raises(ValueError, match="unknown label allocation"):
        allocate_labels(y, 5, "middle")


def test_bad_inputs():
    with pytest.raises(ValueError, match="feature_dim=9"):
        create_head("dsimplex", feature_dim=8, num_classes=10)
    with pytest.raises(ValueError, match=r"\(B, 9\)"):
        dsimplex_logits(torch.randn(3, 8), 10)
    with pytest.raises(ValueError, match="at least 2"):
        dsimplex_prototypes(1)
    with pytest.raises(UnknownNameError, match="dsimplex, linear, polygon"):
        create_head("arcface", feature_dim=2, num_classes=3)
    with pytest.raises(ValueError, match="feature_dim=3"):
        create_head("polygon", feature_dim=3, num_classes=10)


def test_linear_head_normalized():
    head = HEADS.create("linear", feature_dim=3, num_classes=4, bias=False, normalize_weight=True)
    torch.testing.assert_close(head.weight_matrix().norm(dim=1), torch.ones(4))
    f = torch.randn(2, 3)
    torch.testing.assert_close(head(f), f @ head.weight_matrix().T)
