"""Fit FastFill's transformation: FCT's ``h`` plus a per-row uncertainty (Jaeckle et al., ICLR
2023).

The model is the ``"fct"`` transformation kind
(:class:`~raycompat.transformations.fct.FCTTransformation`) built with ``uncertainty=True`` (one
extra Linear on the mixer's hidden features), trained with
:func:`~raycompat.fct.losses.uncertain_transformation_loss` by a plain, seeded PyTorch loop
under :class:`~raycompat.engine.StepGuard`, with FCT appendix D's recipe and defaults: Adam,
linear warm-up then cosine (evaluated per step), BatchNorm running statistics frozen from half
the epochs on, full mini-batches only. No Ray: this is the in-process counterpart of
``raycompat.cluster.train.fct_loop`` for arrays that fit in memory.

:func:`fit_uncertain_transformation` checks and converts the rows (:func:`training_rows`) and the
recipe (:class:`FitRecipe`) first, then runs :func:`_train_epoch` once per epoch.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from raycompat.engine import StepGuard, mean_values, sync_every
from raycompat.errors import ConfigError
from raycompat.fct.losses import (
    UNCERTAINTY_ERRORS,
    freeze_batchnorm_statistics,
    uncertain_transformation_loss,
)
from raycompat.index.distances import as_features
from raycompat.train.schedule import warmup_cosine
from raycompat.transformations import Transformation, create_transformation


@dataclass
class UncertainTransformation:
    """A fitted ``h`` with its uncertainty head; ``history`` holds each epoch's mean loss terms."""

    model: Transformation
    history: list[dict[str, float]] = field(default_factory=list)

    @torch.no_grad()
    def transform(
        self, old: np.ndarray, side: np.ndarray | None = None, batch_size: int = 4096
    ) -> tuple[np.ndarray, np.ndarray]:
        """``old (M, d_old)`` -> ``(h(old) (M, d_new), uncertainty (M,))``, both float32.

        The uncertainty is the predicted log-variance ``sigma`` (larger = less certain).
        """
        old_t = as_features(old, "old").float()
        side_t = None if side is None else as_features(side, "side").float()
        device = next(self.model.parameters()).device
        self.model.eval()
        embeddings, sigmas = [], []
        for start in range(0, old_t.shape[0], batch_size):
            rows = slice(start, start + batch_size)
            emb, sigma = self.model.forward_with_uncertainty(
                old_t[rows].to(device), None if side_t is None else side_t[rows].to(device)
            )
            embeddings.append(emb.float().cpu())
            sigmas.append(sigma.float().cpu())
        return torch.cat(embeddings).numpy(), torch.cat(sigmas).numpy()


def _check(name: str, value, *, integer: bool, positive: bool) -> None:
    """Raise :class:`ConfigError` naming ``name`` unless ``value`` is a finite number (an int if
    ``integer``) that is > 0 (``positive``) or >= 0."""
    kind = numbers.Integral if integer else numbers.Real
    ok = (
        isinstance(value, kind)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )
    if not ok:
        what = "an int" if integer else "a number"
        raise ConfigError(f"{name} must be {what} {'>' if positive else '>='} 0, got {value!r}")


def _check_options(n: int, options: dict) -> None:
    for name in ("epochs", "width", "batch_size"):
        _check(name, options[name], integer=True, positive=True)
    _check("lr", options["lr"], integer=False, positive=True)
    _check("warmup_epochs", options["warmup_epochs"], integer=True, positive=False)
    for name in ("weight_decay", "discriminative_weight"):
        _check(name, options[name], integer=False, positive=False)
    if not 2 <= options["batch_size"] <= n:
        raise ConfigError(
            f"batch_size must be in [2, {n}] (BatchNorm needs 2 rows; only full batches of the "
            f"{n} rows are used), got {options['batch_size']}"
        )


@contextlib.contextmanager
def _held_fixed(classifier):
    """The new model's classifier is not trained: its parameters get no gradient meanwhile."""
    params = list(classifier.parameters()) if isinstance(classifier, nn.Module) else []
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)


@dataclass(frozen=True)
class FitRecipe:
    """FCT appendix D's recipe (its defaults are the paper's): Adam with ``lr`` and
    ``weight_decay``, ``warmup_epochs`` of linear warm-up then cosine, full mini-batches of
    ``batch_size`` rows; ``width`` is h's hidden width and ``discriminative_weight`` weighs the
    classifier's term of :func:`uncertain_transformation_loss`, whose ``error`` (``"cosine"``
    for a normalised gallery, ``"l2"`` for raw rows) is the error sigma estimates."""

    epochs: int = 80
    width: int = 2048
    lr: float = 5e-4
    batch_size: int = 1024
    weight_decay: float = 3.05e-5
    warmup_epochs: int = 5
    discriminative_weight: float = 1.0
    error: str = "cosine"

    def check(self, n: int) -> None:
        """Raise :class:`ConfigError` naming the first option out of range for ``n`` rows."""
        _check_options(n, asdict(self))
        if self.error not in UNCERTAINTY_ERRORS:
            raise ConfigError(
                f"error must be one of {', '.join(UNCERTAINTY_ERRORS.names())}, got {self.error!r}"
            )


@dataclass(frozen=True)
class TrainingRows:
    """The N images' features as float32 tensors: ``old (N, d_old)``, ``new (N, d_new)``,
    ``side (N, d_side)`` or None, ``labels (N,)`` int64 or None."""

    old: torch.Tensor
    new: torch.Tensor
    side: torch.Tensor | None
    labels: torch.Tensor | None

    def __len__(self) -> int:
        return self.old.shape[0]

    @staticmethod
    def take(tensor: torch.Tensor | None, batch: torch.Tensor, device) -> torch.Tensor | None:
        """``tensor``'s rows ``batch`` on ``device`` (None stays None)."""
        return None if tensor is None else tensor[batch].to(device)


def training_rows(old, new, side=None, labels=None, classifier=None) -> TrainingRows:
    """Check that the arrays describe the same N images (labels only with a classifier) and
    convert them; raises ``ValueError`` or :class:`ConfigError` naming the mismatch."""
    old_t, new_t = as_features(old, "old").float(), as_features(new, "new").float()
    n = old_t.shape[0]
    side_t = None if side is None else as_features(side, "side").float()
    for name, other in (("new", new_t), ("side", side_t)):
        if other is not None and other.shape[0] != n:
            raise ValueError(
                f"old and {name} must describe the same {n} images, got {other.shape[0]}"
            )
    if (labels is None) != (classifier is None):
        raise ConfigError("labels and classifier go together: give both or neither")
    labels_t = None
    if labels is not None:
        labels_t = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        if labels_t.shape != (n,):
            raise ConfigError(f"labels must have shape ({n},), got {tuple(labels_t.shape)}")
    return TrainingRows(old_t, new_t, side_t, labels_t)


def _seeded_transformation(
    rows: TrainingRows, recipe: FitRecipe, seed: int, normalize_output: bool, device
) -> Transformation:
    """h with its uncertainty head, initialised from ``seed`` without touching the caller's
    global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = create_transformation(
            "fct",
            d_old=rows.old.shape[1],
            d_side=0 if rows.side is None else rows.side.shape[1],
            d_new=rows.new.shape[1],
            width=recipe.width,
            normalize_output=normalize_output,
            uncertainty=True,
        ).to(device)
    return model


def _train_epoch(
    model: Transformation,
    optimizer: torch.optim.Optimizer,
    guard: StepGuard,
    rows: TrainingRows,
    recipe: FitRecipe,
    epoch: int,
    order: torch.Generator,
    classifier,
    device,
) -> dict[str, float]:
    """One epoch over ``len(rows) // batch_size`` full batches drawn from ``order``; returns
    the epoch's mean loss terms. BN statistics freeze from epoch ``max(1, epochs // 2)``."""
    n, batch_size, take = len(rows), recipe.batch_size, rows.take
    steps = n // batch_size
    model.train()
    if epoch >= max(1, recipe.epochs // 2):
        freeze_batchnorm_statistics(model)
    batches = torch.randperm(n, generator=order)[: steps * batch_size].view(steps, -1)
    sums: dict[str, torch.Tensor] = {}
    for step, batch in enumerate(guard.steps(batches, epoch)):
        scale = warmup_cosine(epoch + step / steps, recipe.epochs, recipe.warmup_epochs)
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * scale
        emb, sigma = model.forward_with_uncertainty(
            take(rows.old, batch, device), take(rows.side, batch, device)
        )
        terms = uncertain_transformation_loss(
            emb,
            sigma,
            take(rows.new, batch, device),
            logits=None if classifier is None else classifier(emb),
            labels=take(rows.labels, batch, device),
            discriminative_weight=recipe.discriminative_weight,
            error=recipe.error,
        )
        values = guard.watch_terms(terms)
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        optimizer.step()  # after the guard's gradient check
        for name, value in values.items():
            sums[name] = sums[name] + value if name in sums else value
    return mean_values(sums, steps)


def fit_uncertain_transformation(
    old: np.ndarray,
    new: np.ndarray,
    *,
    epochs: int = 80,
    seed: int = 0,
    side: np.ndarray | None = None,
    width: int = 2048,
    lr: float = 5e-4,
    batch_size: int = 1024,
    weight_decay: float = 3.05e-5,
    warmup_epochs: int = 5,
    normalize_output: bool = False,
    labels: np.ndarray | None = None,
    classifier=None,
    discriminative_weight: float = 1.0,
    error: str = "cosine",
    device: str | torch.device = "cpu",
) -> UncertainTransformation:
    """Learn ``h(phi_old[, psi]) -> phi_new`` and its uncertainty from the same N images.

    Args:
        old: ``(N, d_old)``, new: ``(N, d_new)``, side: optional ``(N, d_side)`` float arrays.
        epochs, width, lr, batch_size, weight_decay, warmup_epochs: FCT appendix D's recipe
            (the defaults are the paper's; :class:`FitRecipe`); BN statistics freeze from epoch
            ``max(1, epochs // 2)``.
        normalize_output: L2-normalise ``h``'s output (when ``new`` is normalised).
        labels, classifier: ``(N,)`` class ids and the new model's classifier, a callable
            ``(B, d_new) -> (B, K)`` logits on ``device``, held fixed; both or neither. They add
            the discriminative term, weighted by ``discriminative_weight``.
        error: where the error sigma estimates is measured: ``"cosine"`` (default: between
            L2-normalised ``h(old)`` and ``new``, what a cosine search and the oracle order
            compare) or ``"l2"`` (raw rows, for an L2 gallery).
        seed: initial weights and batch order; on CPU the result is bit-for-bit reproducible.
    Raises:
        ConfigError: an option out of range, named.
    """
    rows = training_rows(old, new, side, labels, classifier)
    recipe = FitRecipe(
        epochs=epochs,
        width=width,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        warmup_epochs=warmup_epochs,
        discriminative_weight=discriminative_weight,
        error=error,
    )
    recipe.check(len(rows))
    model = _seeded_transformation(rows, recipe, seed, normalize_output, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    order = torch.Generator().manual_seed(seed)
    guard = StepGuard(
        where="FastFill transformation",
        hint="lower lr",
        sync_every=sync_every(torch.device(device)),
    )
    history = []
    with _held_fixed(classifier), guard.watch(model, optimizer):
        for epoch in range(recipe.epochs):
            history.append(
                _train_epoch(
                    model, optimizer, guard, rows, recipe, epoch, order, classifier, device
                )
            )
    model.eval()
    return UncertainTransformation(model=model, history=history)
