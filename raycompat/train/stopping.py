"""Train to convergence: the validation plateau rule that ends a run before its epoch cap.

A run's ``epochs`` is a cap; with ``stop.rule: plateau`` (:class:`~raycompat.config.train.StopSpec`)
it ends after the first epoch at which its validation score (``selection_score``: top-1 of the
held-out images of the training classes, ECC-gated under CoReS model selection, never the test
split) has not improved by more than ``min_delta`` for ``patience`` epochs, once ``min_epochs``
have run. The epoch kept is the best one (the driver keeps the best-scoring checkpoint), and the
report says how many epochs ran against the cap and why the run ended.

The rule is plain state (the best score and its epoch) saved in every checkpoint's train state,
so a resumed run stops where an uninterrupted one would.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# Why a run ended, as its last report says.
CAP, PLATEAU = "cap", "plateau"


@dataclass
class Plateau:
    """Patience on a score to maximise. ``best``/``best_epoch``: the best score so far and the
    (0-based) epoch that reached it; -inf and -1 before the first."""

    patience: int
    min_delta: float = 0.0
    min_epochs: int = 1
    best: float = -math.inf
    best_epoch: int = -1

    def update(self, epoch: int, score: float) -> bool:
        """Record ``epoch``'s ``score``; True when the run should stop after this epoch."""
        if score > self.best + self.min_delta or self.best_epoch < 0:
            self.best, self.best_epoch = float(score), epoch
        return epoch + 1 >= self.min_epochs and epoch - self.best_epoch >= self.patience

    def restore(self, state: dict | None) -> Plateau:
        if state:
            self.best, self.best_epoch = float(state["best"]), int(state["best_epoch"])
        return self

    @classmethod
    def of(cls, spec) -> Plateau | None:
        """The rule of a :class:`~raycompat.config.train.StopSpec`; None for ``rule: cap``."""
        if spec.rule != PLATEAU:
            return None
        fields = asdict(spec)
        return cls(fields["patience"], fields["min_delta"], fields["min_epochs"])
