"""Baselines every compatibility paper compares against (REFERENCE.md, "Baselines to keep").

- ``independent``: plain cross-entropy from a fresh random initialisation.
- ``ift``: incremental fine-tuning, cross-entropy starting from the old weights (CoReS sec. 4).
- ``l2``: fine-tuning plus ``||phi_new(x) - phi_old(x)||^2`` on the first d_old coordinates.
- ``lwf``: Learning without Forgetting as CoReS compares with it (openBCT's ``--lwf``): a new model
  from a fresh initialisation, cross-entropy through its own head plus the KL divergence, at
  temperature 1, between the frozen old classifier applied to the new features and the same
  classifier applied to the old features, on the old classes. It ties the new features to the old
  classifier's decision regions (and so to the old space), as BCT's influence term does.
- ``lwf_ft``: the fine-tuning form of LwF (Li & Hoiem 2016): the old weights, then distillation of
  the old head's softened outputs (temperature 2) through the new trainable head on the old
  classes. It keeps the old classes' predictions, not the old feature space.
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


def _distillation(student: torch.Tensor, teacher: torch.Tensor, t: float) -> torch.Tensor:
    """Hinton-style ``KL(softmax(teacher / t) || softmax(student / t)) * t^2`` (the t^2 keeps its
    gradient from vanishing with t), mean over the batch."""
    return (
        F.kl_div(
            F.log_softmax(student / t, dim=1),
            F.log_softmax(teacher / t, dim=1),
            log_target=True,
            reduction="batchmean",
        )
        * t
        * t
    )


class _Distillation(CompatibilityMethod):
    """The two LwF forms' shared options: ``weight`` of the distillation term and its
    ``temperature`` (None: the form's own default)."""

    needs_old_model = True
    needs_old_classifier = True
    default_temperature: float = 1.0

    def __init__(
        self, old: OldModel | None = None, weight: float = 1.0, temperature: float | None = None
    ) -> None:
        super().__init__(old)
        self.weight = weight
        self.temperature = self.default_temperature if temperature is None else temperature


class LearningWithoutForgetting(_Distillation):
    name = "lwf"
    init = "random"
    default_temperature = 1.0

    def losses(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        features, terms = classification_terms(model, batch)
        classes = torch.as_tensor(self.old.classes, device=features.device)
        student = self.old.classify(features)[:, classes]
        teacher = self.old.logits(self.old_features(batch))[:, classes]
        terms["distill"] = _distillation(student, teacher, self.temperature)
        return {**terms, "loss": terms["ce"] + self.weight * terms["distill"]}


class FineTunedLearningWithoutForgetting(_Distillation):
    name = "lwf_ft"
    init = "old"
    default_temperature = 2.0

    def losses(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        _, logits = features_and_logits(model, batch.images)
        terms = {"ce": F.cross_entropy(logits, batch.targets)}
        classes = torch.as_tensor(self.old.classes, device=logits.device)
        teacher = self.old.logits(self.old_features(batch))[:, classes]
        terms["distill"] = _distillation(logits[:, classes], teacher, self.temperature)
        return {**terms, "loss": terms["ce"] + self.weight * terms["distill"]}
