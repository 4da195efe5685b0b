"""Backward Compatible Training (Shen et al., CVPR 2020, eq. 3).

``L = CE(new head, phi_new; D_new) + lambda * CE(W_old frozen, phi_new[:, :d_old]; D_new)``.
Classes the old model never saw get old-classifier rows synthesised as the class means of the
old model's **L2-normalised** features on the new training data (BCT sec. 3.3; openBCT's
evaluators average normalised features, REFERENCE.md). Raw means of un-normalised features sit
on another scale than the trained rows (norm ~23 against ~0.6 on LeNet++): with the old model's
own features the influence softmax then puts all its mass on the synthesised rows, and the term
pushes the new model away from the old space instead of into it. When the old classifier's rows
are unit-normalised (a cosine classifier) the synthesised means are normalised to unit length
too, so that they sit on the same sphere as their neighbours; ``normalize_synthesized`` forces
either choice.
When the new embedding is wider, the influence loss uses its first d_old coordinates
(REFERENCE.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from raycompat.methods.base import (
    Batch,
    CompatibilityMethod,
    OldModel,
    classification_terms,
    influence_loss,
)


def class_feature_sums(
    old_features: Callable[[Batch], torch.Tensor],
    loader: Iterable[Batch],
    num_classes: int,
    dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class sums ``(K, d_old)`` and counts ``(K,)`` of the L2-normalised
    ``old_features(batch)``."""
    sums = torch.zeros(num_classes, dim, dtype=torch.float64)
    counts = torch.zeros(num_classes, dtype=torch.float64)
    for batch in loader:
        feats = F.normalize(old_features(batch).double().cpu(), dim=1)
        targets = batch.targets.cpu()
        sums.index_add_(0, targets, feats)
        counts.index_add_(0, targets, torch.ones_like(targets, dtype=torch.float64))
    return sums, counts


class BackwardCompatibleTraining(CompatibilityMethod):
    name = "bct"
    init = "random"
    needs_old_model = True
    needs_old_classifier = True

    def __init__(
        self,
        old: OldModel | None = None,
        weight: float = 1.0,
        normalize_synthesized: bool | None = None,
    ) -> None:
        super().__init__(old)
        self.weight = weight
        self.normalize_synthesized = normalize_synthesized
        self.influence_classifier: torch.Tensor | None = None

    def prepare(self, model, loader: Iterable[Batch]) -> None:
        num_classes = model.num_classes
        rows = torch.zeros(num_classes, self.old.embed_dim)
        known = torch.zeros(num_classes, dtype=torch.bool)
        old_rows = self.old.classifier.detach().cpu().float()
        for c in self.old.classes:
            if c < num_classes:
                rows[c], known[c] = old_rows[c], True
        sums, counts = class_feature_sums(
            self.old_features, loader, num_classes, self.old.embed_dim
        )
        synthesise = (~known) & (counts > 0)
        means = (sums[synthesise] / counts[synthesise, None]).float()
        normalize = self.normalize_synthesized
        if normalize is None:
            norms = old_rows.norm(dim=1)
            normalize = bool(torch.allclose(norms, torch.ones_like(norms), atol=1e-4))
        rows[synthesise] = F.normalize(means, dim=1) if normalize else means
        self.influence_classifier = rows
        self._has_row = known | synthesise

    def losses(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        if self.influence_classifier is None:
            raise RuntimeError("bct: call prepare(model, loader) before training")
        features, terms = classification_terms(model, batch)
        terms["influence"] = influence_loss(
            features, self.influence_classifier, self._has_row, batch.targets, self.name
        )
        return {**terms, "loss": terms["ce"] + self.weight * terms["influence"]}
