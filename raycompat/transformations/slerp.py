"""The ``"slerp"`` kind: a Procrustes map, then spherical interpolation along the geodesic.

After Ricci, Biondi and Pernici, "Spherical Interpolation for Backward-Compatible Multimodal
Representations" (NeurIPS 2026, arXiv 2609.39836; code: miccunifi/SLERP_backward_compatibility,
``slerp_bc/method.py``). The paper aligns a new model's query to the old gallery's space by
orthogonal Procrustes on unit support rows, ``v = phi_new(q) R``, and searches the old gallery
with a point on the geodesic between the *old model's own embedding of the query*
``u = phi_old(q)`` and ``v`` (its eq. for ``q_alpha``; ``alpha = 0``: the old model, 1:
Procrustes alone), one ``alpha`` selected on the support set by Recall@1:

    slerp(u, v, alpha) = (sin((1 - alpha) theta) u + sin(alpha theta) v) / sin theta,
    theta = angle(u, v)

That needs both models on every query. A map here has one input (``h(x)``: the query side's
``map_arrays``, the transform pipeline's rows), so this kind's ``u`` is what ``x`` alone gives
in the target space: the input itself read there, ``x E`` with ``E = eye(d_old, d_new)`` (the
first ``min(d_old, d_new)`` coordinates, zero-padded: the paper's padding). Then

    h(x) = slerp(normalize(x^ E), normalize(x^ R), alpha),   x^ = x / ||x||

``alpha = 1`` is Procrustes alone (on unit rows), ``alpha = 0`` the unmapped input; in between
it shrinks the alignment toward the input, which helps where the two spaces still share
coordinates (a fine-tuned new model) and a small support set leaves ``R`` noisy; between
unrelated spaces its fit picks ``alpha = 1``. The paper's own two-model form is
``slerp(phi_old(q), h.aligned(phi_new(q)), alpha)``, with an ``alpha`` chosen on labelled
queries: pairs of one item alone cannot choose it (``alpha = 0`` returns the item's own target
exactly). Both endpoints are unit rows in the target width; for ``d_old > d_new`` the paper
measures ``theta`` in the zero-padded ``d_old`` space instead. The output is unit rows
(``normalize_output`` is always True). No side-information (``d_side = 0``). Fitted by
:func:`~raycompat.transformations.slerp_fit.fit_slerp`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raycompat.transformations.linear import LinearMap

EPS = 1e-7  # keeps acos and 1 / sin(theta) finite at theta = 0 and pi (the paper's clamp)


def spherical_interpolation(
    u: torch.Tensor, v: torch.Tensor, alpha: float | torch.Tensor
) -> torch.Tensor:
    """The point ``alpha`` of the way along the geodesic from ``u (N, d)`` to ``v (N, d)``
    (rows L2-normalised first), as unit rows ``(N, d)``. Where ``u`` and ``v`` (nearly)
    coincide it is their normalised linear interpolation, the limit of the formula."""
    u, v = F.normalize(u, dim=1), F.normalize(v, dim=1)
    cos = (u * v).sum(dim=1, keepdim=True).clamp(-1 + EPS, 1 - EPS)
    theta = torch.acos(cos)
    q = (torch.sin((1 - alpha) * theta) * u + torch.sin(alpha * theta) * v) / torch.sin(theta)
    near = theta < 1e-3  # sin(theta) ~ theta: the formula loses precision; lerp is exact there
    q = torch.where(near, (1 - alpha) * u + alpha * v, q)
    return F.normalize(q, dim=1)


class SlerpTransformation(LinearMap):
    """``forward(old (N, d_old)) -> slerp(anchor(old), aligned(old), alpha) (N, d_new)``, unit
    rows. ``weight`` is the Procrustes ``R (d_old, d_new)`` (``bias`` stays 0); ``alpha`` a
    buffer, fitted with it. A fresh one has ``R = E`` and ``alpha = 1``: the input read in the
    target space, unit rows."""

    kind = "slerp"

    def __init__(
        self, d_old: int, d_new: int, d_side: int = 0, normalize_output: bool = True
    ) -> None:
        if not normalize_output:
            raise ValueError("a 'slerp' transformation's output is unit rows: normalize_output")
        super().__init__(d_old, d_new, d_side, normalize_output=True)
        self.register_buffer("alpha", torch.tensor(1.0))
        self.register_buffer("anchor_map", torch.eye(d_old, d_new), persistent=False)

    def set_alpha(self, alpha: float) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"slerp: alpha must be in [0, 1], got {alpha}")
        self.alpha.fill_(alpha)

    def aligned(self, old: torch.Tensor) -> torch.Tensor:
        """``normalize(normalize(old) R)``: the Procrustes end of the geodesic (unit rows)."""
        self.linear(old, None)  # checks the shape
        return F.normalize(F.normalize(old, dim=1) @ self.weight, dim=1)

    def anchor(self, old: torch.Tensor) -> torch.Tensor:
        """``normalize(old E)``: the input read in the target space, the other end."""
        return F.normalize(old @ self.anchor_map, dim=1)

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        if side is not None:
            raise ValueError("a 'slerp' transformation takes no side-information")
        aligned = self.aligned(old)  # first: it checks the shape
        return spherical_interpolation(self.anchor(old), aligned, self.alpha)
