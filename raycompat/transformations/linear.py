"""The ``"procrustes"`` and ``"affine"`` kinds: ``h(x) = x W + b``, fitted without training.

Both are one matrix ``weight (d_old, d_new)`` and one ``bias (d_new,)``, stored as buffers in
the same ``<name>.safetensors`` + ``<name>.json`` as FCT's ``h``
(:mod:`raycompat.transformations.files`); they differ in how they are fitted
(:mod:`raycompat.transformations.fit`), which the kind records:

- ``procrustes``: ``W`` orthogonal (semi-orthogonal for unequal widths), the closed form of
  Schoenemann (1966) from the SVD of the cross-covariance; ``b = 0``, or the means' offset
  when fitted centred. An orthogonal map is an isometry: cosine scores among mapped rows are
  those among the input rows.
- ``affine``: least squares with the lambda-orthogonality penalty (Ricci et al., arXiv
  2509.16664); lambda = 0 is plain least squares.

Neither takes side-information (``d_side = 0``). A freshly built one is the identity on the
first ``min(d_old, d_new)`` coordinates (zero-padded or truncated), so a spec alone builds a
harmless map; its fit fills in the weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from raycompat.transformations.base import Transformation


class LinearMap(Transformation):
    """``forward(old (N, d_old)) -> old @ weight + bias (N, d_new)``, L2-normalised when
    ``normalize_output``. The base of every kind whose first term is linear (no ``kind``)."""

    def __init__(
        self, d_old: int, d_new: int, d_side: int = 0, normalize_output: bool = False
    ) -> None:
        super().__init__()
        if d_side != 0:
            raise ValueError(
                f"a {self.kind!r} transformation takes no side-information: d_side must be 0, "
                f"got {d_side}"
            )
        self.d_old, self.d_side, self.d_new = d_old, 0, d_new
        self.normalize_output = normalize_output
        self.register_buffer("weight", torch.eye(d_old, d_new))
        self.register_buffer("bias", torch.zeros(d_new))

    def spec(self) -> dict[str, Any]:
        return {
            "d_old": self.d_old,
            "d_side": self.d_side,
            "d_new": self.d_new,
            "normalize_output": self.normalize_output,
        }

    def set_weights(self, weight, bias) -> None:
        """Copy a fitted ``weight (d_old, d_new)`` and ``bias (d_new,)`` (arrays or tensors) in,
        as float32."""
        self.weight.copy_(torch.as_tensor(weight, dtype=torch.float32))
        self.bias.copy_(torch.as_tensor(bias, dtype=torch.float32))

    def linear(self, old: torch.Tensor, side: torch.Tensor | None) -> torch.Tensor:
        """The linear term ``old @ weight + bias``, after checking the input's shape."""
        if old.ndim != 2 or old.shape[1] != self.d_old:
            raise ValueError(
                f"expected old embeddings of shape (N, {self.d_old}), got {tuple(old.shape)}"
            )
        if side is not None:
            raise ValueError(f"a {self.kind!r} transformation takes no side-information")
        return torch.addmm(self.bias, old, self.weight)

    def output(self, out: torch.Tensor) -> torch.Tensor:
        return F.normalize(out, dim=1) if self.normalize_output else out

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.linear(old, side))


class ProcrustesTransformation(LinearMap):
    """An orthogonal map (plus the centred fit's offset); fitted by
    :func:`~raycompat.transformations.fit.fit_procrustes`."""

    kind = "procrustes"


class AffineTransformation(LinearMap):
    """An affine map kept near orthogonal by a penalty; fitted by
    :func:`~raycompat.transformations.fit.fit_affine`."""

    kind = "affine"
