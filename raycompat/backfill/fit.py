"""Fit FastFill's transformation: FCT's ``h`` plus a per-row uncertainty (Jaeckle et al., ICLR
2023).

The model is :class:`~raycompat.fct.transformation.FCTTransformation` built with
``uncertainty=True`` (one extra Linear on the mixer's hidden features), trained with
:func:`~raycompat.fct.transformation.uncertain_transformation_loss` by a plain, seeded PyTorch loop
under :class:`~raycompat.engine.StepGuard`, with FCT appendix D's recipe and defaults: Adam,
linear warm-up then cosine (evaluated per step), BatchNorm running statistics frozen from half
the epochs on, full mini-batches only. No Ray: this is the in-process counterpart of
``raycompat.cluster.train.fct_loop`` for arrays that fit in memory.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from raycompat.config import ConfigError
from raycompat.engine import StepGuard
from raycompat.fct.transformation import (
    FCTTransformation,
    fct_transformation,
    freeze_batchnorm_statistics,
    uncertain_transformation_loss,
    warmup_cosine,
)
from raycompat.index.distances import as_features


@dataclass
class UncertainTransformation:
    """A fitted ``h`` with its uncertainty head; ``history`` holds each epoch's mean loss terms."""

    model: FCTTransformation
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
    device: str | torch.device = "cpu",
) -> UncertainTransformation:
    """Learn ``h(phi_old[, psi]) -> phi_new`` and its uncertainty from the same N images.

    Args:
        old: ``(N, d_old)``, new: ``(N, d_new)``, side: optional ``(N, d_side)`` float arrays.
        epochs, width, lr, batch_size, weight_decay, warmup_epochs: FCT appendix D's recipe
            (the defaults are the paper's); BN statistics freeze from epoch
            ``max(1, epochs // 2)``.
        normalize_output: L2-normalise ``h``'s output (when ``new`` is normalised).
        labels, classifier: ``(N,)`` class ids and the new model's classifier, a callable
            ``(B, d_new) -> (B, K)`` logits on ``device``, held fixed; both or neither. They add
            the discriminative term, weighted by ``discriminative_weight``.
        seed: initial weights and batch order; on CPU the result is bit-for-bit reproducible.
    Raises:
        ConfigError: an option out of range, named.
    """
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
    _check_options(
        n,
        dict(
            epochs=epochs,
            width=width,
            batch_size=batch_size,
            lr=lr,
            warmup_epochs=warmup_epochs,
            weight_decay=weight_decay,
            discriminative_weight=discriminative_weight,
        ),
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = fct_transformation(
            old_t.shape[1],
            0 if side_t is None else side_t.shape[1],
            new_t.shape[1],
            width=width,
            normalize_output=normalize_output,
            uncertainty=True,
        ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    order = torch.Generator().manual_seed(seed)
    guard = StepGuard(where="FastFill transformation", hint="lower lr")
    steps = n // batch_size
    history = []

    def rows_of(tensor: torch.Tensor | None, batch: torch.Tensor) -> torch.Tensor | None:
        return None if tensor is None else tensor[batch].to(device)

    with _held_fixed(classifier), guard.watch(model, optimizer):
        for epoch in range(epochs):
            model.train()
            if epoch >= max(1, epochs // 2):
                freeze_batchnorm_statistics(model)
            batches = torch.randperm(n, generator=order)[: steps * batch_size].view(steps, -1)
            sums: dict[str, float] = {}
            for step, batch in enumerate(guard.steps(batches, epoch)):
                for group in optimizer.param_groups:
                    group["lr"] = lr * warmup_cosine(epoch + step / steps, epochs, warmup_epochs)
                emb, sigma = model.forward_with_uncertainty(
                    rows_of(old_t, batch), rows_of(side_t, batch)
                )
                terms = uncertain_transformation_loss(
                    emb,
                    sigma,
                    rows_of(new_t, batch),
                    logits=None if classifier is None else classifier(emb),
                    labels=rows_of(labels_t, batch),
                    discriminative_weight=discriminative_weight,
                )
                values = guard.check_terms(terms)
                optimizer.zero_grad(set_to_none=True)
                terms["loss"].backward()
                optimizer.step()  # after the guard's gradient check
                for name, value in values.items():
                    sums[name] = sums.get(name, 0.0) + value
            history.append({name: total / steps for name, total in sums.items()})
    model.eval()
    return UncertainTransformation(model=model, history=history)
