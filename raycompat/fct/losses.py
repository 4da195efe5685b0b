"""The losses FCT's transformation is trained with (Ramanujan et al., CVPR 2022, sec. 3.3) and
FastFill's uncertainty-weighted form (Jaeckle et al., ICLR 2023), with appendix D's BatchNorm
freezing. The model they train is a transformation kind
(:class:`raycompat.transformations.fct.FCTTransformation`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raycompat.registry import Registry


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
