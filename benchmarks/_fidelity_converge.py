"""Training to convergence for the ``regime`` protocol of ``benchmarks/fidelity.py`` (issue 51):
the papers' recipe and the validation-plateau rule, one model at a time.

Each epoch sets the learning rate from the schedule (:func:`raycompat.train.schedule.lr_at`:
SGD 0.1, momentum 0.9, weight decay 5e-4, cosine over the cap, as CoReS' CIFAR recipe), trains
on augmented batches (``crop_flip``, drawn per image from a generator seeded per model; the old
model sees the same batch), then scores the validation images of the step's training identities
(1:N top-1, cosine, the query excluded by index) and feeds the score to
:class:`raycompat.train.stopping.Plateau`. The run ends on the plateau or at the cap (the
budget); the weights kept are the best validation epoch's. Validation images are never
augmented, and no evaluation image is ever seen here (docs/fidelity.md, "Protocol `regime`").
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator

import torch

from raycompat.data.augment import AUGMENTATIONS, Augmentation
from raycompat.engine import StepGuard, extract_features, tensor_batches, train_epoch
from raycompat.evaluation import EvalSet, score
from raycompat.methods import Batch
from raycompat.train.schedule import lr_at, optimizer_factory
from raycompat.train.stopping import CAP, PLATEAU, Plateau


def augmentation(name: str, padding: int) -> Augmentation:
    """The registered augmentation ``name``; a cropping one pads by ``padding`` pixels (CIFAR's
    4 of 32 is an eighth of the side: 2 at 16 x 16)."""
    augment = type(AUGMENTATIONS.get(name))()
    if hasattr(augment, "padding"):
        augment.padding = padding
    return augment


def on_device(
    batches: Iterable[Batch],
    device: torch.device,
    augment: Augmentation | None = None,
    draws: torch.Generator | None = None,
) -> Iterator[Batch]:
    """``batches`` on ``device``, each image augmented by parameters drawn from ``draws`` in
    the order of the images (drawn on the host, applied where the pixels are)."""
    for batch in batches:
        images = batch.images.to(device)
        if augment is not None and augment.params:
            images = augment.apply(images, augment.draw_batch(len(images), draws))
        yield Batch(images=images, targets=batch.targets.to(device), replay=batch.replay)


def features_on(model, images: torch.Tensor, device: torch.device, chunk: int = 4096):
    """Raw ``(N, d)`` features on the host, computed on ``device`` in chunks of ``chunk``."""
    if device.type == "cpu":
        return extract_features(model, images)
    parts = [
        extract_features(model, images[i : i + chunk].to(device)).cpu()
        for i in range(0, len(images), chunk)
    ]
    return torch.cat(parts)


def validation_score(model, images: torch.Tensor, labels: torch.Tensor, device) -> float:
    """1:N top-1 of the model's own validation features (the query excluded by index)."""
    feats = features_on(model, images, device)
    return score("identification", feats, feats, EvalSet(labels=labels.numpy()), "cosine")


def train_to_convergence(model, method, x, y, val_x, val_y, optim, seed: int, where: str):
    """Train ``model`` on ``(x, y)`` until the validation score on ``(val_x, val_y)``
    plateaus (``optim.patience`` epochs without a gain above ``optim.min_delta``, once
    ``optim.min_epochs`` have run) or the cap (``optim.epochs``) is reached; load the best
    epoch's weights. Every gradient's total norm is clipped to ``optim.clip_grad_norm``.

    ``seed`` seeds the batch order and the augmentation draws (the same for every method at a
    step, so that methods are compared on the same batches). Returns the last epoch's loss
    terms and the model's record: ``epochs_run``, ``best_epoch`` (1-based), ``cap``,
    ``stopped`` (``plateau`` or ``cap``), ``best_val_top1`` and the curve ``val_top1``
    (percent, one per epoch run).
    """
    device = torch.device(optim.device)
    spec = optim.spec()
    optimizer = optimizer_factory(spec)(model.parameters())
    plateau = Plateau(optim.patience, optim.min_delta, optim.min_epochs)
    order = torch.Generator().manual_seed(seed)
    draws = torch.Generator().manual_seed(seed + 7_777_777)
    augment = augmentation(optim.augment, optim.padding)
    guard = StepGuard(clip_grad_norm=optim.clip_grad_norm, where=where)
    curve, best_state, stopped, terms = [], None, CAP, {}
    for epoch in range(optim.epochs):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(spec, epoch, optim.epochs)
        batches = on_device(tensor_batches(x, y, optim.batch_size, order), device, augment, draws)
        terms = train_epoch(model, method, batches, optimizer, guard, epoch)
        curve.append(validation_score(model, val_x, val_y, device))
        stop = plateau.update(epoch, curve[-1])
        if plateau.best_epoch == epoch:
            best_state = copy.deepcopy(model.state_dict())
        if stop:
            stopped = PLATEAU if epoch + 1 < optim.epochs else CAP
            break
    model.load_state_dict(best_state)
    record = {
        "epochs_run": len(curve),
        "best_epoch": plateau.best_epoch + 1,
        "cap": optim.epochs,
        "stopped": stopped,
        "best_val_top1": 100.0 * plateau.best,
        "val_top1": [100.0 * value for value in curve],
    }
    return terms, record
