"""The compatibility-method interface.

A method turns a batch into named loss terms for the model being trained (the "new" model),
possibly using a frozen old model. It also declares how the new model is initialised
(``init``): ``random`` (fresh seed), ``same_seed`` (CoReS: the same initialisation at every
upgrade) or ``old`` (fine-tuning from the old weights), and whether it needs a replay buffer.

Methods are plain objects, not ``nn.Module`` s: they hold frozen tensors (pseudo classifiers,
synthesised rows) that must never reach an optimiser, and a reference to the old model that
must never be wrapped by DDP/FSDP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from raycompat.methods.catalog import METHODS
from raycompat.nn.models import features_and_logits


@dataclass
class Batch:
    """One training batch.

    Attributes:
        images: ``(B, C, H, W)``.
        targets: ``(B,)`` int64 head indices (labels after allocation, see ``allocate_labels``).
        replay: ``(B,)`` bool, True for samples drawn from the replay buffer (CL2R), or None.
        old_features: ``(B, d_old)`` features from a black-box old model, or None.
    """

    images: torch.Tensor
    targets: torch.Tensor
    replay: torch.Tensor | None = None
    old_features: torch.Tensor | None = None


class OldModel:
    """A frozen previous model: a feature extractor and, if available, its classifier rows.

    Args:
        extract: ``(B, C, H, W) -> (B, d_old)``; called under ``torch.no_grad``.
        embed_dim: d_old.
        classifier: ``(K_old, d_old)`` frozen classifier rows, or None (black box / no head).
        classes: the class labels the old model was trained on (rows of ``classifier`` that are
            meaningful); defaults to all rows.
        head: the old model's full head ``(B, d_old) -> (B, K_old)`` logits (bias included), for
            distillation methods; None for a black box.
    """

    def __init__(
        self,
        extract: Callable[[torch.Tensor], torch.Tensor],
        embed_dim: int,
        classifier: torch.Tensor | None = None,
        classes: Iterable[int] | None = None,
        head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self._extract = extract
        self._head = head
        self.embed_dim = embed_dim
        self.classifier = None if classifier is None else classifier.detach().clone()
        if classes is None:
            classes = range(self.classifier.shape[0]) if self.classifier is not None else ()
        self.classes = sorted(int(c) for c in classes)

    @classmethod
    def from_model(
        cls, model: nn.Module, classes: Iterable[int] | None = None, with_classifier: bool = True
    ) -> OldModel:
        """Freeze a :class:`~raycompat.nn.models.CompatModel` (eval mode, no grad)."""
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        if not with_classifier:
            return cls(model.forward_features, model.embed_dim, None, ())
        classifier = model.head.weight_matrix().detach()
        return cls(model.forward_features, model.embed_dim, classifier, classes, model.head)

    @classmethod
    def black_box(cls, extract: Callable[[torch.Tensor], torch.Tensor], embed_dim: int) -> OldModel:
        """An old model that only returns features (NI-FCL's setting)."""
        return cls(extract, embed_dim, None, ())

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self._extract(images).detach()

    @torch.no_grad()
    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The old head's logits for old features (distillation targets)."""
        if self._head is None:
            raise ValueError("this old model has no classifier head (black box)")
        return self._head(features).detach()

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """The frozen old head's logits for the new model's ``features`` (their first d_old
        coordinates), with gradients to the features: the head's own weights stay frozen."""
        if self._head is None:
            raise ValueError("this old model has no classifier head (black box)")
        return self._head(first_coordinates(features, self.embed_dim))

    def to(self, device: torch.device | str) -> OldModel:
        if self.classifier is not None:
            self.classifier = self.classifier.to(device)
        return self


class CompatibilityMethod:
    """Base class. Subclasses set the class attributes and implement :meth:`losses`."""

    name: str = ""
    init: str = "random"  # random | same_seed | old
    needs_old_model: bool = False
    needs_old_classifier: bool = False
    uses_replay: bool = False
    fixed_head: bool = False

    def __init__(self, old: OldModel | None = None) -> None:
        if self.needs_old_model and old is None:
            raise ValueError(f"method {self.name!r} needs an old model (old_model is missing)")
        if self.needs_old_classifier and (old is None or old.classifier is None):
            raise ValueError(
                f"method {self.name!r} needs the old model's classifier; the old model given is a "
                "black box or was loaded without its head (use nifcl_avg/nifcl_rw instead)"
            )
        self.old = old

    def check_model(self, model: nn.Module) -> None:
        """Reject a model that cannot be trained with this method, before any step runs."""
        if self.fixed_head and not getattr(model.head, "fixed", False):
            raise ValueError(f"method {self.name!r} needs a fixed (dsimplex/polygon) head")

    def prepare(self, model: nn.Module, loader: Iterable[Batch]) -> None:
        """One pass over the training data before training (pseudo classifiers, synthesised rows).

        The default needs nothing.
        """

    def old_features(self, batch: Batch) -> torch.Tensor:
        if batch.old_features is not None:
            return batch.old_features
        return self.old.features(batch.images)

    def losses(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def __call__(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        terms = self.losses(model, batch)
        if "loss" not in terms:
            raise RuntimeError(f"method {self.name!r} returned no 'loss' term")
        return terms

    def to(self, device: torch.device | str) -> CompatibilityMethod:
        if self.old is not None:
            self.old.to(device)
        return self


def classification_terms(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict]:
    """Features of the new model and its plain cross-entropy over all head outputs."""
    features, logits = features_and_logits(model, batch.images)
    if not torch.isfinite(features).all():
        raise FloatingPointError("the model produced non-finite features (NaN/inf)")
    return features, {"ce": F.cross_entropy(logits, batch.targets)}


class CrossEntropyMethod(CompatibilityMethod):
    """Plain cross-entropy over every head output; subclasses differ only in their policy."""

    def losses(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        _, terms = classification_terms(model, batch)
        return {**terms, "loss": terms["ce"]}


def influence_loss(
    features: torch.Tensor,
    rows: torch.Tensor,
    has_row: torch.Tensor,
    targets: torch.Tensor,
    method: str,
) -> torch.Tensor:
    """BCT's influence term (BCT eq. 3, NI-FCL eq. 6/12): cross-entropy of the new features'
    first d_old coordinates through a frozen classifier.

    The softmax runs over the classes that have a row (``has_row``); a class without one cannot
    be a target.

    Args:
        features: ``(B, d_new)`` new features; rows: ``(K, d_old)``; has_row: ``(K,)`` bool;
        targets: ``(B,)``.
    """
    has_row = has_row.to(targets.device)
    missing = ~has_row[targets]
    if missing.any():
        raise ValueError(
            f"{method}: no influence-classifier row for classes "
            f"{targets[missing].unique().tolist()} (absent from the prepare() pass)"
        )
    present = has_row.nonzero().squeeze(1)
    logits = first_coordinates(features, rows.shape[1]) @ rows.to(features.device)[present].T
    remap = torch.full((rows.shape[0],), -1, dtype=torch.long, device=targets.device)
    remap[present] = torch.arange(present.numel(), device=targets.device)
    return F.cross_entropy(logits, remap[targets])


def first_coordinates(features: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` coordinates of the new features (BCT's rule when widths differ)."""
    if features.shape[1] < width:
        raise ValueError(
            f"new features have width {features.shape[1]} < old width {width}; BCT-style "
            "influence losses need d_new >= d_old"
        )
    return features[:, :width]


def create_method(name: str, **kwargs) -> CompatibilityMethod:
    """The registered method ``name`` (``raycompat.methods.catalog``) built with ``kwargs``."""
    return METHODS.create(name, **kwargs)
