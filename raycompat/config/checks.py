"""Checks of a training config that need no data, torch or Ray.

The upgrade job runs them (:func:`raycompat.config.upgrade.check_upgrade_config`) before it
imports anything heavy, so a wrong eval split, a class the open-set test holds out, a missing
weights file or a budget outside [0, 1] is one line in well under a second. The training code
uses the same functions (``raycompat.train.data`` and ``raycompat.backfill`` re-export them).
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path

from raycompat.config.train import TrainConfig
from raycompat.errors import ConfigError


def check_eval_split(cfg: TrainConfig, labels=None) -> None:
    """``eval.split`` and ``eval.test_classes`` agree with each other and, when ``labels`` (an
    ``(N,)`` array of the training labels) is given, with the data."""
    spec = cfg.eval
    if spec.split == "closed_set":
        if spec.test_classes:
            raise ConfigError(
                "eval.test_classes is only used with eval.split: open_set (closed_set holds "
                "out eval.test_fraction of every class)"
            )
        return
    classes = spec.test_classes
    if not classes:
        raise ConfigError("eval.split: open_set needs eval.test_classes, the unseen classes")
    if spec.dataset is not None:
        raise ConfigError(
            "eval.split: open_set holds test classes out of the training data; with "
            "eval.dataset (a separate test set) leave eval.split at closed_set"
        )
    if len(set(classes)) != len(classes) or min(classes) < 0:
        raise ConfigError(f"eval.test_classes {classes}: must be distinct labels >= 0")
    if labels is not None:
        import numpy as np  # only with data in hand; the config check itself needs none

        missing = sorted(set(classes) - set(np.unique(labels).tolist()))
        if missing:
            raise ConfigError(f"eval.test_classes: no images of class(es) {missing}")


def check_unseen(cfg: TrainConfig, trained: list[int], what: str) -> None:
    """Open set: ``what`` may not train on any test class (that would make it closed-set)."""
    overlap = sorted(set(cfg.eval.test_classes) & set(int(c) for c in trained))
    if cfg.eval.split == "open_set" and overlap:
        raise ConfigError(
            f"{what} trains on class(es) {overlap}, which eval.test_classes holds out for the "
            "open-set test; train on other classes or change eval.test_classes"
        )


def check_weight_files(cfg: TrainConfig, prefix: str = "") -> None:
    """Every weights file the config names opens, before Ray starts (a missing one is one line
    naming the key, ``prefix`` + key, not a worker traceback after retries)."""
    named = [("model.weights", cfg.model.weights)]
    named += [
        (f"scenario.replacements[{i}].model.weights", r.model.weights)
        for i, r in enumerate(cfg.scenario.replacements)
    ]
    old = cfg.scenario.old_model
    if old is not None and old.checkpoint and not Path(old.checkpoint).is_dir():
        named.append(("scenario.old_model.checkpoint", old.checkpoint))
    named = [(key, uri) for key, uri in named if uri]
    if named:
        from raycompat.io.uri import check_uri  # the I/O layer (pyarrow, fsspec), not torch

        for key, uri in named:
            check_uri(uri, prefix + key)


def check_budget(budget, name: str = "budget") -> float:
    """``budget`` as a float in [0, 1]; raises :class:`ConfigError` (a ValueError) naming
    ``name`` for a non-number, NaN, a negative value or a value above 1."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise ConfigError(f"{name} must be a number in [0, 1], got {budget!r}")
    value = float(budget)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be a fraction of the gallery in [0, 1], got {value!r}")
    return value
