"""Linear centred kernel alignment (Kornblith et al., ICML 2019, eq. 5), used in FCT sec. 5.3.

``CKA(X, Y) = ||Y_c^T X_c||_F^2 / (||X_c^T X_c||_F ||Y_c^T Y_c||_F)`` with column-centred
``X_c, Y_c``. This feature-space form equals ``HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`` with
linear kernels ``K = X X^T``, ``L = Y Y^T``, but costs O(N d^2) instead of an N x N Gram matrix.
"""

from __future__ import annotations

from typing import Any

import torch

from raycompat.index.distances import as_features


def linear_cka(x: Any, y: Any) -> float:
    """Similarity of two representations of the same N examples.

    Args:
        x: ``(N, d1)`` features (e.g. old model); y: ``(N, d2)`` features (e.g. side-information).
    Returns:
        CKA in [0, 1]; invariant to orthogonal transforms and isotropic scaling of either input.
    Raises:
        ValueError: different N, fewer than 2 rows, or a constant (zero-variance) input.
    """
    a = as_features(x, "x").double()
    b = as_features(y, "y").double()
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"x and y must describe the same examples: {a.shape[0]} != {b.shape[0]}")
    if a.shape[0] < 2:
        raise ValueError("linear CKA needs at least 2 examples")
    a, b = _centre(a, "x"), _centre(b.to(a.device), "y")
    norm_x = torch.linalg.matrix_norm(a.T @ a)
    norm_y = torch.linalg.matrix_norm(b.T @ b)
    return float(torch.linalg.matrix_norm(b.T @ a) ** 2 / (norm_x * norm_y))


def _centre(x: torch.Tensor, name: str) -> torch.Tensor:
    centred = x - x.mean(dim=0, keepdim=True)
    # Relative test: centring a constant column leaves rounding noise, not exact zeros.
    if float(centred.abs().max()) <= 1e-12 * max(float(x.abs().max()), 1e-300):
        raise ValueError(f"{name} is constant across examples: CKA is undefined")
    return centred
