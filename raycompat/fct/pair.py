"""The model an FCT transformation run trains: ``h`` and optionally ``g`` behind one forward
(Ramanujan et al., CVPR 2022, sec. 3.3 and 4.3), with FastFill's loss terms for ``h``
(Jaeckle et al., ICLR 2023). Built from a :class:`~raycompat.config.fct.TransformationTrainConfig`;
no Ray here (the run: :mod:`raycompat.cluster.train.fct_loop`).
"""

from __future__ import annotations

import torch
from torch import nn

from raycompat.config.fct import TransformationTrainConfig
from raycompat.fct.losses import uncertain_transformation_loss
from raycompat.train.export import load_exported_model
from raycompat.transformations import FCTTransformation, side_info_transformation


class TransformationPair(nn.Module):
    """``h`` and optionally ``g`` behind one ``forward``, so one strategy wraps both.

    One optimizer steps both on the sum of their MSEs; the two share no parameter, so each gets
    exactly the gradient (and, with Adam's per-parameter state, the update) of its own loss.
    """

    def __init__(self, h: nn.Module, g: nn.Module | None = None) -> None:
        super().__init__()
        self.h, self.g = h, g

    def forward(self, old: torch.Tensor, side: torch.Tensor):
        """``(N, d_old), (N, d_side) -> (h (N, d_new), g (N, d_side_new) or None, sigma (N,)
        or None)``; ``sigma``: h's uncertainty, when it has the head."""
        g = self.g(old, side) if self.g is not None else None
        if self.h.uncertainty_head is None:
            return self.h(old, side), g, None
        h, sigma = self.h.forward_with_uncertainty(old, side)
        return h, g, sigma


def build_transformations(cfg: TransformationTrainConfig) -> TransformationPair:
    h = FCTTransformation(
        cfg.h.d_old,
        cfg.h.d_side,
        cfg.h.d_new,
        cfg.h.width,
        cfg.h.normalize_output,
        uncertainty=cfg.h.uncertainty,
    )
    g = None
    if cfg.g is not None:
        g = side_info_transformation(cfg.h.d_old, cfg.h.d_side, cfg.g.d_side_new, cfg.g.width)
    return TransformationPair(h, g)


def g_dims(cfg: TransformationTrainConfig) -> dict:
    """``g``'s dims as its export records them."""
    d_old, d_side = cfg.h.d_old, cfg.h.d_side
    return dict(
        d_old=d_old,
        d_side=d_side,
        d_new=cfg.g.d_side_new,
        width=cfg.g.width,
        normalize_output=False,
    )


def fixed_classifier(cfg: TransformationTrainConfig, device: torch.device):
    """The new model's ``forward_head`` for FastFill's discriminative term (held fixed), or
    None when ``cfg.classifier`` is not set."""
    if cfg.classifier is None:
        return None
    model = load_exported_model(cfg.classifier)[0].to(device)
    model.requires_grad_(False)
    return model.forward_head


def uncertain_h_terms(h_out, sigma, target, classifier, labels, weight: float, error="l2"):
    """``(loss, logged terms)`` of FastFill's uncertainty-weighted loss for ``h``: ``h_mse``,
    ``h_sigma`` (mean log-variance), ``h_loss``, with a classifier ``h_discriminative``, and
    ``h_error`` when the ``error`` sigma estimates is not ``"l2"``."""
    logits = None if classifier is None else classifier(h_out)
    fit = uncertain_transformation_loss(
        h_out, sigma, target, logits, None if logits is None else labels, weight, error=error
    )
    return fit["loss"], {f"h_{name}": value for name, value in fit.items()}
