"""Training the adapter's residual MLP to convergence on a held-out share of its pairs.

:func:`train_residual` runs AdamW on the MLP of an
:class:`~raycompat.transformations.adapter.AdapterTransformation` whose linear term is already
fitted, with a cosine learning-rate schedule over the step cap (Loshchilov and Hutter, "SGDR",
ICLR 2017, without restarts), and stops by a rule on pairs it never trains on (early
stopping, Prechelt, "Early Stopping - But When?", 1998): every ``eval_every`` steps it measures
the mean squared residual on the held-out pairs, keeps the best weights, and stops once
``patience`` evaluations in a row have not improved on the best by ``min_delta`` (relative).
The step cap and the wall-time cap bound it; the best weights seen are what it returns, so a
run cut short by either cap still ends at its best evaluation. Batches are one seeded
permutation of the training rows per epoch, so the same arguments give the same weights on one
machine unless the wall-time cap stops it. No Ray here.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch

from raycompat.transformations.base import Transformation


@dataclass(frozen=True)
class TrainingBudget:
    """How long the MLP trains: at most ``steps`` AdamW steps and ``max_seconds`` of wall
    time, evaluated on the held-out pairs every ``eval_every`` steps and stopped after
    ``patience`` evaluations without a relative improvement of ``min_delta``."""

    steps: int = 5000
    batch_size: int = 256
    lr: float = 3e-3
    weight_decay: float = 1e-4
    eval_every: int = 100
    patience: int = 20
    min_delta: float = 1e-3
    max_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.eval_every < 1 or self.patience < 1:
            raise ValueError(
                f"adapter fit: steps >= 0, batch_size, eval_every, patience >= 1: {self}"
            )
        if self.lr <= 0 or self.max_seconds <= 0:
            raise ValueError(f"adapter fit: lr and max_seconds must be > 0: {self}")


@dataclass(frozen=True)
class TrainingRun:
    """What :func:`train_residual` did: ``best`` held-out residual (mean squared per pair) and
    the step it was reached at, ``steps`` run, and why it ``stopped`` (``"converged"``,
    ``"step cap"`` or ``"time cap"``)."""

    best: float
    best_step: int
    steps: int
    stopped: str
    seconds: float


def held_out_residual(h: Transformation, old: torch.Tensor, new: torch.Tensor) -> float:
    """Mean squared ``||h(old) - new||^2`` per pair; leaves ``h`` in eval mode."""
    h.eval()
    with torch.inference_mode():
        return float(((h(old) - new) ** 2).sum(dim=1).mean())


def _batches(rows: int, batch_size: int, generator: torch.Generator):
    """Index batches of ``min(batch_size, rows)``: one permutation per epoch, forever."""
    size = min(batch_size, rows)
    while True:
        order = torch.randperm(rows, generator=generator)
        for start in range(0, rows - size + 1, size):
            yield order[start : start + size]


def train_residual(h, train: tuple, held: tuple, budget: TrainingBudget, seed: int) -> TrainingRun:
    """Train ``h.mlp`` on ``train = (old (n, d_old), new (n, d_new))`` float32 tensors, early
    stopped on ``held`` (the same, other rows); ``h`` ends holding the best weights seen on
    ``held`` (its weights at the start if no step improved on them), in eval mode.

    It runs on one intra-op thread (restored after): its products are small (a 256-row batch),
    and on the shared 2-core machine two threads made 1500 steps take 24 s instead of 5."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(h, train, held, budget, seed)
    finally:
        torch.set_num_threads(threads)


def _train(h, train: tuple, held: tuple, budget: TrainingBudget, seed: int) -> TrainingRun:
    old, new = train
    start, best = time.monotonic(), held_out_residual(h, *held)
    best_state, best_step, stale = copy.deepcopy(h.mlp.state_dict()), 0, 0
    optimizer = torch.optim.AdamW(
        h.mlp.parameters(), lr=budget.lr, weight_decay=budget.weight_decay
    )
    batches = _batches(len(old), budget.batch_size, torch.Generator().manual_seed(seed))
    step, stopped = 0, "step cap"
    while step < budget.steps:
        if time.monotonic() - start > budget.max_seconds:
            stopped = "time cap"
            break
        for group in optimizer.param_groups:
            group["lr"] = budget.lr * 0.5 * (1 + math.cos(math.pi * step / budget.steps))
        h.train()
        rows = next(batches)
        loss = ((h(old[rows]) - new[rows]) ** 2).sum(dim=1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % budget.eval_every and step < budget.steps:
            continue
        residual = held_out_residual(h, *held)
        if residual < best * (1 - budget.min_delta):
            best, best_step, stale = residual, step, 0
            best_state = copy.deepcopy(h.mlp.state_dict())
        elif residual < best:  # a gain below min_delta still gives better weights to keep
            best, best_step = residual, step
            best_state, stale = copy.deepcopy(h.mlp.state_dict()), stale + 1
        else:
            stale += 1
        if stale >= budget.patience:
            stopped = "converged"
            break
    h.mlp.load_state_dict(best_state)
    h.eval()
    return TrainingRun(best, best_step, step, stopped, time.monotonic() - start)
