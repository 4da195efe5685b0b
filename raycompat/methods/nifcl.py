"""Non-Inherent Feature Compatible Learning (NI-FCL, ICLR 2021 submission, eqs. 4-12).

The old model may be a black box: no classifier, no old data. A pseudo classifier is built from
the old model's features on the NEW training data and used in BCT's influence loss (eq. 6/12):

- ``nifcl_avg``: row n = L2-normalised mean of phi_old features of class n (eq. 4-5; the
  un-normalised mean does not converge, as the paper notes).
- ``nifcl_rw``: random-walk refinement per class (eq. 7-11): ``S`` = cosine similarities,
  ``S'`` = row-softmax of ``S / T`` over j != i with a zero diagonal,
  ``F_inf = (1 - lam) F_0 (I - lam S')^-1`` (closed form of
  ``F_t = lam F_{t-1} S' + (1 - lam) F_0``); row = normalised column mean of F_inf.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from raycompat.methods.base import (
    Batch,
    CompatibilityMethod,
    OldModel,
    classification_terms,
    influence_loss,
)


def transition_matrix(features: torch.Tensor, temperature: float) -> torch.Tensor:
    """``S'`` of eq. 8 for one class.

    Args:
        features: ``(m, d)``.
    Returns:
        ``(m, m)`` row-stochastic matrix with a zero diagonal.
    """
    normed = F.normalize(features, dim=1)
    scores = normed @ normed.T / temperature
    scores.fill_diagonal_(float("-inf"))
    return torch.softmax(scores, dim=1)


def random_walk_closed_form(
    features: torch.Tensor, temperature: float = 0.05, lam: float = 0.9
) -> torch.Tensor:
    """Eq. 10 with features as rows: ``F_inf^T = (1 - lam) (I - lam S')^-T F_0^T``.

    Args:
        features: ``(m, d)`` old features of one class (m >= 2).
    Returns:
        ``(m, d)`` refined features.
    """
    if features.shape[0] < 2:
        return features.clone()
    s = transition_matrix(features.double(), temperature)
    eye = torch.eye(s.shape[0], dtype=s.dtype)
    # F (I - lam S')^-1 with F as (d, m) equals solve((I - lam S')^T, F^T)^T.
    refined_t = torch.linalg.solve((eye - lam * s).T, features.double())
    return ((1 - lam) * refined_t).to(features.dtype)


def random_walk_iterative(
    features: torch.Tensor, temperature: float = 0.05, lam: float = 0.9, steps: int = 500
) -> torch.Tensor:
    """Eq. 9 iterated ``steps`` times (reference for the closed form)."""
    if features.shape[0] < 2:
        return features.clone()
    s = transition_matrix(features.double(), temperature)
    f0 = features.double().T  # (d, m), the paper's layout
    f = f0.clone()
    for _ in range(steps):
        f = lam * f @ s + (1 - lam) * f0
    return f.T.to(features.dtype)


class _PseudoClassifier(CompatibilityMethod):
    init = "random"
    needs_old_model = True
    refine = False

    def __init__(
        self,
        old: OldModel | None = None,
        weight: float = 1.0,
        temperature: float = 0.05,
        lam: float = 0.9,
    ) -> None:
        super().__init__(old)
        self.weight, self.temperature, self.lam = weight, temperature, lam
        self.pseudo_classifier: torch.Tensor | None = None

    def prepare(self, model, loader: Iterable[Batch]) -> None:
        per_class: dict[int, list[torch.Tensor]] = {}
        for batch in loader:
            feats = self.old_features(batch).float().cpu()
            for c in batch.targets.unique().tolist():
                per_class.setdefault(c, []).append(feats[batch.targets.cpu() == c])
        rows = torch.zeros(model.num_classes, self.old.embed_dim)
        self._has_row = torch.zeros(model.num_classes, dtype=torch.bool)
        for c, chunks in per_class.items():
            feats = torch.cat(chunks)
            if self.refine:
                feats = random_walk_closed_form(feats, self.temperature, self.lam)
            rows[c] = F.normalize(feats.mean(dim=0), dim=0)
            self._has_row[c] = True
        self.pseudo_classifier = rows

    def losses(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        if self.pseudo_classifier is None:
            raise RuntimeError(f"{self.name}: call prepare(model, loader) before training")
        features, terms = classification_terms(model, batch)
        terms["influence"] = influence_loss(
            features, self.pseudo_classifier, self._has_row, batch.targets, self.name
        )
        return {**terms, "loss": terms["ce"] + self.weight * terms["influence"]}


class NIFCLAverage(_PseudoClassifier):
    name = "nifcl_avg"
    refine = False


class NIFCLRandomWalk(_PseudoClassifier):
    name = "nifcl_rw"
    refine = True
