"""The ``"fct"`` kind: FCT's transformation MLP (Ramanujan et al., CVPR 2022, sec. 3.3 and
appendix D).

``h(phi_old, psi) -> phi_new``: two projection MLPs (Linear-BN-ReLU-Linear-BN-ReLU), one for the
old embedding and one for the side-information, concatenated, then a mixer MLP of the same form
ending in a Linear to ``d_new``. Embeddings are ``(N, D)`` so Linear/BatchNorm1d are used (the
reference's 1x1 convolutions are an artefact of its image-shaped tensors). ``g`` has the same
shape and maps ``(phi_old, psi_old) -> psi_new`` so that side-information moves forward too
(FCT sec. 4.3, Fig. 6). Trained with MSE to the target (eq. in sec. 3.3; the losses and the run
are FCT's method, :mod:`raycompat.fct`); if the target embeddings are L2-normalised the output
is normalised in training and inference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from raycompat.transformations.base import Transformation


def _mlp(d_in: int, width: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(d_in, width),
        nn.BatchNorm1d(width),
        nn.ReLU(inplace=True),
        nn.Linear(width, d_out),
        nn.BatchNorm1d(d_out),
        nn.ReLU(inplace=True),
    )


class FCTTransformation(Transformation):
    """``forward(old (N, d_old), side (N, d_side)) -> (N, d_new)``.

    With ``uncertainty=True`` a linear head on the mixer's hidden features (the input of its
    last Linear) also predicts a per-row log-variance ``sigma``, FastFill's uncertainty
    (Jaeckle et al., ICLR 2023): :meth:`forward_with_uncertainty`. Without it, ``forward`` and
    the ``state_dict`` keys are those of the plain FCT transformation.
    """

    kind = "fct"
    spec_keys = ("d_old", "d_side", "d_new", "width", "normalize_output")
    spec_defaults = {"uncertainty": False}  # FastFill's head; exports before it have none

    def __init__(
        self,
        d_old: int,
        d_side: int,
        d_new: int,
        width: int = 2048,
        normalize_output: bool = False,
        uncertainty: bool = False,
    ) -> None:
        super().__init__()
        self.d_old, self.d_side, self.d_new = d_old, d_side, d_new
        self.normalize_output = normalize_output
        self.old_projection = _mlp(d_old, width, width)
        self.side_projection = _mlp(d_side, width, width) if d_side > 0 else None
        mixer_in = width * (2 if d_side > 0 else 1)
        self.mixer = nn.Sequential(_mlp(mixer_in, width, width), nn.Linear(width, d_new))
        # Built last, so that the shared layers draw the same initial weights with or without it.
        self.uncertainty_head = nn.Linear(width, 1) if uncertainty else None

    def spec(self) -> dict[str, Any]:
        return {
            "d_old": self.d_old,
            "d_side": self.d_side,
            "d_new": self.d_new,
            "width": self.old_projection[0].out_features,
            "normalize_output": self.normalize_output,
            "uncertainty": self.has_uncertainty,
        }

    @property
    def has_uncertainty(self) -> bool:
        return self.uncertainty_head is not None

    def _hidden(self, old: torch.Tensor, side: torch.Tensor | None) -> torch.Tensor:
        """The mixer's hidden features ``(N, width)``, before its last Linear."""
        if old.ndim != 2 or old.shape[1] != self.d_old:
            raise ValueError(
                f"expected old embeddings of shape (N, {self.d_old}), got {tuple(old.shape)}"
            )
        parts = [self.old_projection(old)]
        if self.side_projection is not None:
            if side is None or side.ndim != 2 or side.shape[1] != self.d_side:
                got = None if side is None else tuple(side.shape)
                raise ValueError(
                    f"expected side-information of shape (N, {self.d_side}), got {got}"
                )
            parts.append(self.side_projection(side))
        return self.mixer[0](torch.cat(parts, dim=1))

    def _embedding(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.mixer[1](hidden)
        return F.normalize(out, dim=1) if self.normalize_output else out

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        return self._embedding(self._hidden(old, side))

    def forward_with_uncertainty(
        self, old: torch.Tensor, side: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h (N, d_new), sigma (N,))``: ``sigma`` estimates ``log E||h - phi_new||^2``
        (larger = less certain); see
        :func:`raycompat.fct.losses.uncertain_transformation_loss`."""
        if self.uncertainty_head is None:
            raise ValueError("this transformation was built without uncertainty=True")
        hidden = self._hidden(old, side)
        return self._embedding(hidden), self.uncertainty_head(hidden)[:, 0]


def side_info_transformation(
    d_old: int, d_side_old: int, d_side_new: int, width: int = 2048
) -> FCTTransformation:
    """g: (old embedding, old side-info) -> new side-info (FCT sec. 4.3)."""
    return FCTTransformation(d_old, d_side_old, d_side_new, width, normalize_output=False)
