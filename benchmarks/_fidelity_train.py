"""Training half of ``benchmarks/fidelity.py``: model sequences, FCT's ``h`` and side-information.

Everything is the Ray-free core run in process: models come from ``raycompat.nn.models``,
losses from the ``raycompat.methods`` registry, steps from ``raycompat.engine.train_epoch``
(under one :class:`~raycompat.engine.StepGuard` per model), FastFill's ``h`` from
``raycompat.backfill.fit_uncertain_transformation``, FCT's model from
``raycompat.transformations`` and its loss from ``raycompat.fct.losses``.

A sequence follows the CoReS protocol (as the demo does): model ``t`` trains on the union of the
classes of steps ``0..t``, initialised by its method's policy (``random``: seed ``s + 1 + t``;
``same_seed``: seed ``s``; ``old``: the previous model's weights), with the previous model frozen
as its old model. The first model of a method that needs an old model is trained with
``independent`` (it has nothing to be compatible with).

Each model trains for exactly ``Optim.epochs`` epochs of Adam (``mnist5k``, ``synthetic``), or,
under a stopping rule (``regime``), to convergence with the papers' recipe
(:mod:`_fidelity_converge`), its record of epochs run against the cap kept beside it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _fidelity_converge import augmentation, features_on, on_device, train_to_convergence
from torch import nn

from raycompat.backfill import UncertainTransformation, fit_uncertain_transformation
from raycompat.backfill.fit import FitRecipe, training_rows
from raycompat.config.train import OptimSpec
from raycompat.engine import StepGuard, tensor_batches, train_epoch
from raycompat.fct.losses import freeze_batchnorm_statistics, transformation_loss
from raycompat.methods import METHODS, Batch, OldModel, create_method
from raycompat.methods.base import CompatibilityMethod, CrossEntropyMethod
from raycompat.nn.models import CompatModel, create_model
from raycompat.nn.side_info import create_side_info, nt_xent_loss, simclr_views
from raycompat.train.schedule import optimizer_factory, warmup_cosine
from raycompat.transformations import FCTTransformation

log = logging.getLogger("benchmarks.fidelity")


@dataclass(frozen=True)
class TrainData:
    """Training images ``(N, C, H, W)`` float in [0, 1], labels ``(N,)`` (class c -> output c),
    ``steps``: classes known at each step (step t trains on labels < steps[t])."""

    images: torch.Tensor
    labels: torch.Tensor
    steps: tuple[int, ...]
    num_outputs: int
    backbone: str
    backbone_kwargs: dict
    embed_dim: int  # of the learnable-head models; fixed heads take num_outputs - 1
    # models see (x - input_mean) / input_std (0 and 1: the images as they are)
    input_mean: float = 0.0
    input_std: float = 1.0
    # held-out images of the training classes, for the stopping rule only (``regime``)
    val_images: torch.Tensor | None = None
    val_labels: torch.Tensor | None = None

    def step_rows(self, step: int) -> torch.Tensor:
        return torch.nonzero(self.labels < self.steps[step]).squeeze(1)

    def step_validation(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The validation images and labels of the classes step ``step`` trains on."""
        if self.val_images is None:
            raise ValueError("this protocol has no validation split: it cannot stop on one")
        rows = torch.nonzero(self.val_labels < self.steps[step]).squeeze(1)
        return self.val_images[rows], self.val_labels[rows]


@dataclass(frozen=True)
class Optim:
    """How each model trains. The defaults past ``lr`` are ``mnist5k``'s and ``synthetic``'s:
    Adam at a constant lr for exactly ``epochs`` epochs, no augmentation, no validation.
    ``patience`` set (``regime``): ``epochs`` is a cap and the run stops on a validation
    plateau, with the optimiser, schedule and augmentation given here
    (:func:`_fidelity_converge.train_to_convergence`)."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "adam"
    momentum: float = 0.0
    weight_decay: float = 0.0
    schedule: str = "constant"
    milestones: tuple[int, ...] = field(default_factory=tuple)
    augment: str = "none"
    padding: int = 4
    patience: int | None = None
    min_delta: float = 0.0
    min_epochs: int = 1
    clip_grad_norm: float | None = None
    device: str = "cpu"

    def spec(self) -> OptimSpec:
        return OptimSpec(
            name=self.optimizer,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            schedule=self.schedule,
            milestones=list(self.milestones),
        )


class StandardizedInput(nn.Module):
    """A backbone that first standardises its input, ``(x - mean) / std`` (torchvision's
    ``Normalize`` with constants): images in (0, 1) centred on 0.5 leave LeNet++ at chance for
    epochs (docs/fidelity.md, "Sizing the synthetic protocol")."""

    def __init__(self, backbone: nn.Module, mean: float, std: float) -> None:
        super().__init__()
        self.inner, self.mean, self.std = backbone, mean, std
        self.embed_dim = backbone.embed_dim

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.forward_features((x - self.mean) / self.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)


def new_model(method_name: str, seed: int, data: TrainData) -> CompatModel:
    """A fresh model for ``method_name`` drawn from ``seed``: a fixed d-Simplex head when the
    method needs one (width ``num_outputs - 1``), else a learnable linear head; its backbone
    standardises the input when ``data`` says so."""
    torch.manual_seed(seed)
    if METHODS.get(method_name).fixed_head:
        head, width = "dsimplex", None
    else:
        head, width = "linear", data.embed_dim
    model = create_model(
        data.backbone,
        head,
        num_classes=data.num_outputs,
        embed_dim=width,
        backbone_kwargs=data.backbone_kwargs,
    )
    if (data.input_mean, data.input_std) != (0.0, 1.0):
        model.backbone = StandardizedInput(model.backbone, data.input_mean, data.input_std)
    return model


def _behaviour(method: CompatibilityMethod) -> str:
    """What a method's training depends on: methods whose losses and prepare are plain
    cross-entropy's (``independent``, ``fct``, ``ift``, ``cores`` ...) share one name, so two of
    them with the same head, initialisation and old model train the same model."""
    cls = type(method)
    plain = cls.losses is CrossEntropyMethod.losses and cls.prepare is CompatibilityMethod.prepare
    return "cross_entropy" if plain else f"{cls.__module__}.{cls.__qualname__}"


class SequenceTrainer:
    """Trains each method's sequence of models for one protocol and seed.

    Models that the same computation would produce twice (the first model of every
    learnable-head method; ``independent`` and ``fct``, which differ only in what is done with
    their models afterwards) are trained once and shared: :attr:`trained` counts the models
    actually trained. With a ``cache`` folder they are shared across processes too (one folder
    per protocol and seed): a trained model's weights are saved there under its key, and a
    trainer that finds them loads them instead of training (:attr:`loaded`). Training is seeded
    per model, never from process state, so a loaded model is the one training would give.

    Under a stopping rule (``optim.patience``) each trained model also has a record
    (:meth:`records`: epochs run against the cap, the epoch kept, the validation curve), saved
    beside its weights in the cache.
    """

    def __init__(
        self,
        data: TrainData,
        optim: Optim,
        seed: int,
        options: dict | None = None,
        cache: Path | None = None,
    ) -> None:
        self.data, self.optim, self.seed = data, optim, seed
        self.options = options or {}  # {method: its options}, else the registry's defaults
        self.cache = cache
        self._models: dict[tuple, CompatModel] = {}
        self._records: dict[tuple, dict] = {}
        self._chains: dict[str, list[tuple[tuple, tuple]]] = {}  # method: [(key, init)]
        self.trained = self.loaded = 0
        self.train_seconds = 0.0

    def sequence(self, method_name: str) -> list[CompatModel]:
        models: list[CompatModel] = []
        key: tuple | None = None
        chain = []
        for step in range(len(self.data.steps)):
            previous = models[-1] if models else None
            method, init = self._method(method_name, step, previous)
            key = (_behaviour(method), method.fixed_head, init, step, key)
            if key not in self._models:
                model = self._load(key, method_name, init, previous)
                if model is None:
                    model = self._train(method, method_name, step, init, previous, key)
                    self._save(key, model)
                self._models[key] = model
            models.append(self._models[key])
            chain.append((key, init))
        self._chains[method_name] = chain
        return models

    def records(self, method_name: str) -> list[dict] | None:
        """Per model of ``method_name``'s sequence (after :meth:`sequence`): its record, plus
        ``epochs_inherited`` (epochs behind the weights it started from: 0 from a fresh
        initialisation, else the previous model's inherited epochs plus its kept epoch) and
        ``epochs_cumulative`` (inherited + run); None without a stopping rule."""
        chain = self._chains[method_name]
        if any(key not in self._records for key, _ in chain):
            return None
        out: list[dict] = []
        for key, init in chain:
            record = dict(self._records[key])
            previous = out[-1] if out else None
            inherited = 0
            if init[0] == "old" and previous is not None:
                inherited = previous["epochs_inherited"] + previous["best_epoch"]
            record["epochs_inherited"] = inherited
            record["epochs_cumulative"] = inherited + record["epochs_run"]
            out.append(record)
        return out

    def _cached(self, key: tuple) -> Path | None:
        if self.cache is None:
            return None
        return self.cache / f"{hashlib.sha256(repr(key).encode()).hexdigest()[:32]}.pt"

    def _load(self, key: tuple, name: str, init: tuple, previous) -> CompatModel | None:
        path = self._cached(key)
        if path is None or not path.exists():
            return None
        model = self._initial(name, init, previous)
        model.load_state_dict(torch.load(path, weights_only=True, map_location=self.optim.device))
        record = path.with_suffix(".json")
        if record.exists():
            self._records[key] = json.loads(record.read_text())
        self.loaded += 1
        return model.eval()

    def _save(self, key: tuple, model: CompatModel) -> None:
        path = self._cached(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if key in self._records:  # written first: the weights' presence means both are there
            _replace(path.with_suffix(".json"), json.dumps(self._records[key]).encode())
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, path)  # whole or absent for a trainer in another process

    def _method(self, name: str, step: int, previous: CompatModel | None):
        """The step's method (with the previous model as its old model) and initialisation."""
        cls = METHODS.get(name)
        if previous is None:
            init = ("seed", self.seed) if cls.init == "same_seed" else ("seed", self.seed + 1)
            return create_method("independent" if cls.needs_old_model else name), init
        classes = range(self.data.steps[step - 1])
        old = OldModel.from_model(copy.deepcopy(previous), classes=classes)
        init = {"old": ("old",), "same_seed": ("seed", self.seed)}.get(
            cls.init, ("seed", self.seed + 1 + step)
        )
        return create_method(name, old=old, **self.options.get(name, {})), init

    def _initial(self, name: str, init: tuple, previous) -> CompatModel:
        """The model a step starts from: the previous one's weights, or fresh from a seed."""
        if init[0] == "old":
            return copy.deepcopy(previous)
        return new_model(name, init[1], self.data).to(self.optim.device)

    def _train(self, method, name: str, step: int, init: tuple, previous, key) -> CompatModel:
        model = self._initial(name, init, previous)
        rows = self.data.step_rows(step)
        x, y = self.data.images[rows], self.data.labels[rows]
        method.check_model(model)
        device = torch.device(self.optim.device)
        method.prepare(model, on_device(tensor_batches(x, y, 256, shuffle=False), device))
        where = f"{name} step {step + 1}"
        start = time.perf_counter()
        if self.optim.patience is None:
            terms = self._train_epochs(model, method, x, y, step, where)
            ran = ""
        else:
            val_x, val_y = self.data.step_validation(step)
            terms, record = train_to_convergence(
                model, method, x, y, val_x, val_y, self.optim, self.seed * 100 + step, where
            )
            self._records[key] = record
            ran = " epochs {epochs_run}/{cap} ({stopped}), kept {best_epoch}: val top-1 {v:.1f}"
            ran = ran.format(**record, v=record["best_val_top1"])
        self.trained += 1
        self.train_seconds += time.perf_counter() - start
        log.info(
            "%s (%d classes, %d images):%s %s",
            where,
            self.data.steps[step],
            len(rows),
            ran,
            _terms(terms),
        )
        return model.eval()

    def _train_epochs(self, model, method, x, y, step: int, where: str) -> dict[str, float]:
        """Exactly ``optim.epochs`` epochs of Adam at a constant lr (``mnist5k``, ``synthetic``)."""
        optimizer = torch.optim.Adam(model.parameters(), lr=self.optim.lr)
        order = torch.Generator().manual_seed(self.seed * 100 + step)
        guard = StepGuard(where=where)
        for epoch in range(self.optim.epochs):
            batches = tensor_batches(x, y, self.optim.batch_size, order)
            terms = train_epoch(model, method, batches, optimizer, guard, epoch)
        return terms


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _terms(terms: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in terms.items())


class SimCLRObjective:
    """NT-Xent between two ``simclr_views`` of each image (FCT's side-information, sec. 3.4),
    as a ``(model, batch) -> terms`` callable that :func:`~raycompat.engine.train_epoch` steps."""

    def __init__(self, generator: torch.Generator, temperature: float) -> None:
        self.generator, self.temperature = generator, temperature

    def __call__(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        views = [simclr_views(batch.images, self.generator) for _ in range(2)]
        z = model(torch.cat(views))
        return nt_xent_loss(*z.chunk(2), temperature=self.temperature)


def train_side_info(images: torch.Tensor, data: TrainData, spec, seed: int):
    """psi: a SimCLR model (no labels) trained on the first step's images, at old-model time,
    then kept: every ``h`` of the sequence takes the same psi (no ``g`` is needed)."""
    torch.manual_seed(seed + 7919)
    model = create_side_info(
        spec.side_info,
        backbone=data.backbone,
        embed_dim=spec.side_dim,
        backbone_kwargs=data.backbone_kwargs,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.side_lr)
    objective = SimCLRObjective(torch.Generator().manual_seed(seed + 7919), spec.side_temperature)
    order = torch.Generator().manual_seed(seed + 104729)
    guard = StepGuard(where="side-information")
    targets = torch.zeros(len(images), dtype=torch.int64)  # unused: no labels
    for epoch in range(spec.side_epochs):
        batches = tensor_batches(images, targets, spec.side_batch_size, order)
        terms = train_epoch(model, objective, batches, optimizer, guard, epoch)
    log.info("side-information (%d images): %s", len(images), _terms(terms))
    return model.eval()


def _recipe(spec, n: int) -> FitRecipe:
    recipe = FitRecipe(
        epochs=spec.epochs,
        width=spec.width,
        lr=spec.lr,
        batch_size=min(spec.batch_size, n),
        warmup_epochs=spec.warmup_epochs,
        discriminative_weight=spec.uncertainty_weight,
    )
    recipe.check(n)
    return recipe


def fit_h(old, new, side, spec, seed: int) -> FCTTransformation:
    """FCT's ``h(phi_old[, psi]) -> phi_new`` by MSE (FCT sec. 3.3, appendix D's schedule: Adam,
    warm-up then cosine per step, BN statistics frozen from half the epochs on)."""
    rows = training_rows(old, new, side)
    recipe = _recipe(spec, len(rows))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        d_side = 0 if rows.side is None else rows.side.shape[1]
        h = FCTTransformation(rows.old.shape[1], d_side, rows.new.shape[1], width=recipe.width)
    optimizer = torch.optim.Adam(h.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    order = torch.Generator().manual_seed(seed)
    guard = StepGuard(where="FCT transformation", hint="lower lr")
    steps = len(rows) // recipe.batch_size
    with guard.watch(h, optimizer):
        for epoch in range(recipe.epochs):
            h.train()
            if epoch >= max(1, recipe.epochs // 2):
                freeze_batchnorm_statistics(h)
            perm = torch.randperm(len(rows), generator=order)[: steps * recipe.batch_size]
            for step, batch in enumerate(guard.steps(perm.view(steps, -1), epoch)):
                scale = warmup_cosine(epoch + step / steps, recipe.epochs, recipe.warmup_epochs)
                for group in optimizer.param_groups:
                    group["lr"] = recipe.lr * scale
                side_batch = None if rows.side is None else rows.side[batch]
                terms = transformation_loss(h(rows.old[batch], side_batch), rows.new[batch])
                guard.check_terms(terms)
                optimizer.zero_grad(set_to_none=True)
                terms["loss"].backward()
                optimizer.step()
    return h.eval()


def fit_fastfill(old, new, labels, classifier, spec, seed: int) -> UncertainTransformation:
    """FastFill's ``h`` with its uncertainty head (no side-information, as the upgrade job
    fits it); ``classifier``: the new model's head (an ``nn.Module``, held fixed) for the
    discriminative term."""
    recipe = _recipe(spec, len(old))
    return fit_uncertain_transformation(
        old,
        new,
        epochs=recipe.epochs,
        seed=seed,
        width=recipe.width,
        lr=recipe.lr,
        batch_size=recipe.batch_size,
        warmup_epochs=recipe.warmup_epochs,
        labels=labels if recipe.discriminative_weight > 0 else None,
        classifier=classifier if recipe.discriminative_weight > 0 else None,
        discriminative_weight=recipe.discriminative_weight,
    )


@torch.no_grad()
def apply_h(h: FCTTransformation, gallery: np.ndarray, side: np.ndarray | None) -> np.ndarray:
    """``normalize(h(gallery[, side]))``: the stored rows of the next version (galleries are
    stored L2-normalised, as the upgrade job stores them)."""
    old = torch.from_numpy(gallery).float()
    out = h(old, None if side is None else torch.from_numpy(side).float())
    return F.normalize(out, dim=1).numpy()


def features(model, images: torch.Tensor) -> np.ndarray:
    """Raw ``(N, d)`` float32 features (:func:`raycompat.engine.extract_features`), computed
    on the model's device."""
    parameter = next(model.parameters(), None)
    device = torch.device("cpu") if parameter is None else parameter.device
    return features_on(model, images, device).numpy()


def normalized(array: np.ndarray) -> np.ndarray:
    return F.normalize(torch.from_numpy(array).float(), dim=1).numpy()


class PassCounter(SequenceTrainer):
    """A :class:`SequenceTrainer` that trains nothing and counts the image passes (forward +
    backward of one image) the same sequences would cost, with the same sharing."""

    def __init__(self, data: TrainData, optim: Optim, seed: int) -> None:
        super().__init__(data, optim, seed)
        self.passes = 0

    def _train(self, method, name: str, step: int, init: tuple, previous, key) -> CompatModel:
        self.passes += len(self.data.step_rows(step)) * self.optim.epochs  # the cap's
        self.trained += 1
        return self._initial(name, init, previous)

    def _initial(self, name: str, init: tuple, previous) -> CompatModel:
        """On the host whatever ``optim.device`` says: nothing is trained (a count of a device
        run can be made without the device)."""
        if init[0] == "old":
            return copy.deepcopy(previous)
        return new_model(name, init[1], self.data)


def seconds_per_pass(data: TrainData, optim: Optim, batches: int = 3) -> float:
    """Measured seconds of one image's training step (plain cross-entropy, ``optim``'s
    optimiser and augmentation, on its device), after a warm-up."""
    model, method = new_model("independent", 0, data), create_method("independent")
    device = torch.device(optim.device)
    model.to(device)
    if optim.patience is None:
        optimizer = torch.optim.Adam(model.parameters(), lr=optim.lr)
    else:
        optimizer = optimizer_factory(optim.spec())(model.parameters())
    augment, draws = augmentation(optim.augment, optim.padding), torch.Generator().manual_seed(0)
    x, y = data.images[: optim.batch_size], data.labels[: optim.batch_size]

    def steps(count: int):
        return on_device([Batch(x, y)] * count, device, augment, draws)

    train_epoch(model, method, steps(1), optimizer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    train_epoch(model, method, steps(batches), optimizer)  # reads its loss: synchronised
    return (time.perf_counter() - start) / (batches * len(x))
