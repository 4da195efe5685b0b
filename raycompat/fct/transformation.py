"""FCT transformation models (Ramanujan et al., CVPR 2022, sec. 3.3 and appendix D).

``h(phi_old, psi) -> phi_new``: two projection MLPs (Linear-BN-ReLU-Linear-BN-ReLU), one for the
old embedding and one for the side-information, concatenated, then a mixer MLP of the same form
ending in a Linear to ``d_new``. Embeddings are ``(N, D)`` so Linear/BatchNorm1d are used (the
reference's 1x1 convolutions are an artefact of its image-shaped tensors). ``g`` has the same
shape and maps ``(phi_old, psi_old) -> psi_new`` so that side-information moves forward too
(FCT sec. 4.3, Fig. 6). Trained with MSE to the target (eq. in sec. 3.3); if the target
embeddings are L2-normalised the output is normalised in training and inference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raycompat.registry import Registry


def _mlp(d_in: int, width: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(d_in, width),
        nn.BatchNorm1d(width),
        nn.ReLU(inplace=True),
        nn.Linear(width, d_out),
        nn.BatchNorm1d(d_out),
        nn.ReLU(inplace=True),
    )


class FCTTransformation(nn.Module):
    """``forward(old (N, d_old), side (N, d_side)) -> (N, d_new)``.

    With ``uncertainty=True`` a linear head on the mixer's hidden features (the input of its
    last Linear) also predicts a per-row log-variance ``sigma``, FastFill's uncertainty
    (Jaeckle et al., ICLR 2023): :meth:`forward_with_uncertainty`. Without it, ``forward`` and
    the ``state_dict`` keys are those of the plain FCT transformation.
    """

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
        (larger = less certain); see :func:`uncertain_transformation_loss`."""
        if self.uncertainty_head is None:
            raise ValueError("this transformation was built without uncertainty=True")
        hidden = self._hidden(old, side)
        return self._embedding(hidden), self.uncertainty_head(hidden)[:, 0]


def fct_transformation(
    d_old: int,
    d_side: int,
    d_new: int,
    width: int = 2048,
    normalize_output: bool = False,
    uncertainty: bool = False,
) -> FCTTransformation:
    """h: (old embedding, side-info) -> new embedding, FCT appendix D widths; ``uncertainty``
    adds FastFill's log-variance head."""
    return FCTTransformation(d_old, d_side, d_new, width, normalize_output, uncertainty)


def side_info_transformation(
    d_old: int, d_side_old: int, d_side_new: int, width: int = 2048
) -> FCTTransformation:
    """g: (old embedding, old side-info) -> new side-info (FCT sec. 4.3)."""
    return FCTTransformation(d_old, d_side_old, d_side_new, width, normalize_output=False)


def transformation_loss(predicted: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """MSE to the target embedding: ``mean_i ||h(x_i) - phi_new(x_i)||^2``."""
    mse = (predicted - target).pow(2).sum(dim=1).mean()
    return {"mse": mse, "loss": mse}


def _squared_l2(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (predicted - target).pow(2).sum(dim=1)


def _squared_unit(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (F.normalize(predicted, dim=1) - F.normalize(target, dim=1)).pow(2).sum(dim=1)


# Per-row error that FastFill's sigma estimates, by the distance the gallery is searched with.
UNCERTAINTY_ERRORS: Registry = Registry("uncertainty error")
UNCERTAINTY_ERRORS.register("l2")(_squared_l2)
UNCERTAINTY_ERRORS.register("cosine")(_squared_unit)


def uncertain_transformation_loss(
    predicted: torch.Tensor,
    sigma: torch.Tensor,
    target: torch.Tensor,
    logits: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    discriminative_weight: float = 1.0,
    error: str = "l2",
) -> dict[str, torch.Tensor]:
    """FastFill's uncertainty-weighted transformation loss (Jaeckle et al., ICLR 2023).

    Per row ``L_i = e(h(x_i), phi_new(x_i)) + w * CE(logits_i, labels_i)`` (the
    discriminative term: the new model's classifier on ``h(phi_old)``, only when ``logits`` and
    ``labels`` are given), and the heteroscedastic form of Kendall & Gal (NeurIPS 2017, eq. 8):
    ``loss = mean_i 0.5 * exp(-sigma_i) * L_i + 0.5 * sigma_i``, minimised per row at
    ``sigma_i = log L_i``. ``e`` is measured where the gallery is searched (``error``, one of
    :data:`UNCERTAINTY_ERRORS`): ``"l2"`` ``||h - phi_new||^2`` for an L2 gallery of raw rows,
    ``"cosine"`` ``||h/|h| - phi_new/|phi_new|||^2`` for a cosine (normalised) gallery, so that
    sigma ranks rows by the error retrieval sees, not by the norm of their features.

    Args:
        predicted, target: ``(N, d_new)``; sigma: ``(N,)`` predicted log-variances;
        logits: ``(N, K)``; labels: ``(N,)`` int64; error: ``"l2"`` or ``"cosine"``.
    Returns:
        ``mse`` (the plain mean of ``||h - phi_new||^2``, :func:`transformation_loss`'s value,
        whatever ``error``), ``error`` (mean ``e``, when it is not ``"l2"``),
        ``discriminative`` (mean CE, when given), ``sigma`` (its mean) and ``loss``.
    """
    if sigma.shape != predicted.shape[:1]:
        raise ValueError(f"sigma must have shape ({predicted.shape[0]},), got {tuple(sigma.shape)}")
    if (logits is None) != (labels is None):
        raise ValueError("the discriminative term needs both logits and labels")
    measure = UNCERTAINTY_ERRORS.get(error)
    per_row = measure(predicted, target)
    terms = {"mse": _squared_l2(predicted, target).mean()}
    if error != "l2":
        terms["error"] = per_row.mean()
    if logits is not None:
        ce = F.cross_entropy(logits, labels, reduction="none")
        terms["discriminative"] = ce.mean()
        per_row = per_row + discriminative_weight * ce
    terms["sigma"] = sigma.mean()
    terms["loss"] = (0.5 * torch.exp(-sigma) * per_row + 0.5 * sigma).mean()
    return terms


def freeze_batchnorm_statistics(module: nn.Module) -> None:
    """Stop BN running-statistics updates (FCT: from half the epochs on).

    The affine parameters keep training; only the running mean and variance freeze.
    """
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()
