"""d-Simplex fixed-classifier methods.

- ``cores`` (CoReS, TPAMI 2023, eq. 7): cross-entropy over ALL K outputs of the fixed d-Simplex
  (future classes stay in the softmax denominator and keep their regions), trained from scratch
  with the same initialisation at every upgrade.
- ``dsimplex_hoc`` (d-Simplex-HOC, eq. 2-4): ``lam * L_sce + (1 - lam) * L_nce(phi_t, phi_{t-1})``
  with ``s_ij = rho * cos(phi_{t-1}(x_i), phi_t(x_j))``. ``nce_mask`` selects the denominator:
  ``exclude`` (default, the paper's eq. 4: the sum over j != i, the positive left out),
  ``zero`` (the public reference code, iamcl2r ``HocLoss``: the similarities are multiplied by
  ``~class_mask``, whose mask holds the diagonal too, so every same-class entry, the positive
  included, becomes 0 and adds exp(0) to the log-sum-exp), ``none`` (plain InfoNCE over the
  whole row, the positive kept).
- ``dsimplex_fd`` (CL2R, Biondi et al. 2023): d-Simplex cross-entropy plus feature distillation
  between normalised old and new features on replay samples.

At the first task there is no previous model; HOC and FD then reduce to the d-Simplex
cross-entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raycompat.methods.base import (
    Batch,
    CompatibilityMethod,
    CrossEntropyMethod,
    OldModel,
    classification_terms,
)

NCE_MASKS = ("exclude", "zero", "none")


def higher_order_nce(
    old: torch.Tensor, new: torch.Tensor, targets: torch.Tensor, rho: float, mask: str = "exclude"
) -> torch.Tensor:
    """Contrastive term of HOC (eq. 4), mean over the batch:
    ``loss_i = -s_ii + log sum_j exp(s'_ij)`` with ``s'`` the scores after ``mask`` (the module
    docstring; ``exclude`` drops j = i, ``zero`` sets every same-class s_ij, j = i included, to 0).

    Args:
        old: ``(B, d)`` features of the frozen previous model.
        new: ``(B, d)`` features of the model being trained.
        targets: ``(B,)`` labels (used by the ``zero`` mask).
    """
    if mask not in NCE_MASKS:
        raise ValueError(f"unknown nce_mask {mask!r}; valid: {', '.join(NCE_MASKS)}")
    scores = rho * F.normalize(old, dim=1) @ F.normalize(new, dim=1).T
    positives = scores.diagonal()
    if mask == "zero":
        scores = scores.masked_fill(targets[:, None] == targets[None, :], 0.0)
    elif mask == "exclude":
        eye = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
        scores = scores.masked_fill(eye, float("-inf"))
    return (torch.logsumexp(scores, dim=1) - positives).mean()


class CoReS(CrossEntropyMethod):
    name = "cores"
    init = "same_seed"
    fixed_head = True


class DSimplexHOC(CompatibilityMethod):
    name = "dsimplex_hoc"
    init = "old"
    fixed_head = True
    uses_replay = True

    def __init__(
        self,
        old: OldModel | None = None,
        lam: float = 0.1,
        rho: float = 10.0,
        nce_mask: str = "exclude",
    ) -> None:
        super().__init__(old)
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"dsimplex_hoc: lam must be in [0, 1], got {lam}")
        if nce_mask not in NCE_MASKS:
            raise ValueError(f"unknown nce_mask {nce_mask!r}; valid: {', '.join(NCE_MASKS)}")
        self.lam, self.rho, self.nce_mask = lam, rho, nce_mask

    def losses(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        features, terms = classification_terms(model, batch)
        if self.old is None and batch.old_features is None:
            return {**terms, "loss": terms["ce"]}
        terms["nce"] = higher_order_nce(
            self.old_features(batch), features, batch.targets, self.rho, self.nce_mask
        )
        return {**terms, "loss": self.lam * terms["ce"] + (1 - self.lam) * terms["nce"]}


class DSimplexFD(CompatibilityMethod):
    name = "dsimplex_fd"
    init = "old"
    fixed_head = True
    uses_replay = True

    def __init__(
        self, old: OldModel | None = None, weight: float = 1.0, distance: str = "cosine"
    ) -> None:
        super().__init__(old)
        if distance not in ("cosine", "mse"):
            raise ValueError(f"dsimplex_fd: distance must be cosine or mse, got {distance!r}")
        self.weight, self.distance = weight, distance

    def losses(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        features, terms = classification_terms(model, batch)
        if self.old is None and batch.old_features is None:
            return {**terms, "loss": terms["ce"]}
        replay = (
            batch.replay
            if batch.replay is not None
            else torch.ones_like(batch.targets, dtype=torch.bool)
        )
        old = F.normalize(self.old_features(batch), dim=1)
        new = F.normalize(features, dim=1)
        if self.distance == "cosine":
            per_sample = 1.0 - (old * new).sum(dim=1)
        else:
            per_sample = (old - new).pow(2).sum(dim=1)
        weights = replay.to(per_sample.dtype)
        terms["fd"] = (per_sample * weights).sum() / weights.sum().clamp_min(1.0)
        return {**terms, "loss": terms["ce"] + self.weight * terms["fd"]}
