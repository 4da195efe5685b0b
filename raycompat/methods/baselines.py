"""Baselines every compatibility paper compares against (REFERENCE.md, "Baselines to keep").

- ``independent``: plain cross-entropy from a fresh random initialisation.
- ``ift``: incremental fine-tuning, cross-entropy starting from the old weights (CoReS sec. 4).
- ``l2``: fine-tuning plus ``||phi_new(x) - phi_old(x)||^2`` on the first d_old coordinates.
- ``lwf``: Learning without Forgetting (Li & Hoiem 2016): fine-tuning plus distillation of the old
  classifier's softened outputs on the old classes.
- ``er``: experience replay with a learnable classifier: cross-entropy on batches that mix the new
  task with a replay buffer (the mixing happens in the data pipeline).
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
    first_coordinates,
)
from raycompat.nn.models import features_and_logits


class Independent(CrossEntropyMethod):
    name = "independent"
    init = "random"


class IncrementalFineTuning(CrossEntropyMethod):
    name = "ift"
    init = "old"


class ExperienceReplay(CrossEntropyMethod):
    name = "er"
    init = "old"
    uses_replay = True


class L2ToOldFeatures(CompatibilityMethod):
    name = "l2"
    init = "old"
    needs_old_model = True

    def __init__(self, old: OldModel | None = None, weight: float = 1.0) -> None:
        super().__init__(old)
        self.weight = weight

    def losses(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        features, terms = classification_terms(model, batch)
        old = self.old_features(batch)
        new = first_coordinates(features, old.shape[1])
        terms["l2"] = (new - old).pow(2).sum(dim=1).mean()
        return {**terms, "loss": terms["ce"] + self.weight * terms["l2"]}


class LearningWithoutForgetting(CompatibilityMethod):
    name = "lwf"
    init = "old"
    needs_old_model = True
    needs_old_classifier = True

    def __init__(
        self, old: OldModel | None = None, weight: float = 1.0, temperature: float = 2.0
    ) -> None:
        super().__init__(old)
        self.weight = weight
        self.temperature = temperature

    def losses(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        _, logits = features_and_logits(model, batch.images)
        terms = {"ce": F.cross_entropy(logits, batch.targets)}
        classes = torch.as_tensor(self.old.classes, device=logits.device)
        old_logits = self.old.logits(self.old_features(batch))[:, classes]
        t = self.temperature
        # Hinton-style distillation, scaled by t^2 so its gradient does not vanish with t.
        terms["distill"] = (
            F.kl_div(
                F.log_softmax(logits[:, classes] / t, dim=1),
                F.log_softmax(old_logits / t, dim=1),
                log_target=True,
                reduction="batchmean",
            )
            * t
            * t
        )
        return {**terms, "loss": terms["ce"] + self.weight * terms["distill"]}
