"""FCT sweeps: each trial also learns the transformation ``h`` and is scored on ``h(old)``.

A sweep with a ``transformation`` section (and an FCT base method) searches the
transformation's keys next to the training ones: ``transformation.width``,
``transformation.epochs``, ``transformation.optim.lr``, ... After training, the trial learns
``h: phi_{T-1} -> phi_T`` on the last model's training images (as the upgrade job does) and
replaces the validation cross-test ``M(T, T-1)`` by ``M(T, h(T-1))``: queries of the new model
against the transformed old gallery, which is what an FCT upgrade serves. The stored cross-test
is kept in the table as ``stored_cross_test``.

With a ``backfill`` section too (a :class:`~raycompat.config.upgrade.PartialBackfillSpec`),
``h`` learns FastFill's uncertainty, and the trial also scores the partial-backfill curves on
the validation images (:func:`raycompat.upgrade.backfill_eval.backfill_evaluation`): the
``backfill_*`` metrics the ``backfill_auc`` and ``backfill_top1_at_budget`` objectives read.
Its keys are searchable as ``backfill.uncertainty_weight``, ``backfill.budget``, ...
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from raycompat.cluster.tune.space import trial_overrides
from raycompat.config import apply_overrides
from raycompat.config.fct import FCTSpec, PartialBackfillSpec
from raycompat.config.train import RunSpec, TrainConfig
from raycompat.config.tune import SweepConfig
from raycompat.errors import ConfigError
from raycompat.evaluation import score
from raycompat.methods.catalog import method_entry
from raycompat.metrics.compatibility import CompatibilityMatrix

PREFIX = "transformation."
BACKFILL = "backfill."
BACKFILL_OBJECTIVES = ("backfill_auc", "backfill_top1_at_budget")


def split_params(params: dict) -> tuple[dict, dict]:
    """Trial parameters -> (training-config keys, transformation keys without the prefix);
    ``backfill.`` keys are in neither (see :func:`backfill_of`)."""
    training = {k: v for k, v in params.items() if not k.startswith((PREFIX, BACKFILL))}
    transformation = {k[len(PREFIX) :]: v for k, v in params.items() if k.startswith(PREFIX)}
    return training, transformation


def backfill_of(sweep: SweepConfig, params: dict) -> PartialBackfillSpec | None:
    """The trial's :class:`PartialBackfillSpec` (the sweep's section with the trial's values),
    or None."""
    if sweep.backfill is None:
        return None
    keys = {k[len(BACKFILL) :]: v for k, v in params.items() if k.startswith(BACKFILL)}
    return apply_overrides(sweep.backfill, trial_overrides(keys))


def transformation_of(sweep: SweepConfig, params: dict) -> FCTSpec | None:
    """The trial's :class:`FCTSpec` (the sweep's section with the trial's values), or None."""
    if sweep.transformation is None:
        return None
    return apply_overrides(sweep.transformation, trial_overrides(split_params(params)[1]))


def check_transformation(sweep: SweepConfig, base: TrainConfig) -> None:
    """Transformation keys need a ``transformation`` section, which needs an FCT method."""
    check_backfill(sweep)
    keys = [s.key for s in sweep.space if s.key.startswith(PREFIX)]
    if keys and sweep.transformation is None:
        raise ConfigError(
            f"space keys {keys} tune the FCT transformation: add a 'transformation:' section "
            "(FCTSpec: width, epochs, batch_size, optim) to the sweep config"
        )
    if sweep.transformation is None:
        return
    if not method_entry(base.method).needs_transformation:
        raise ConfigError(
            f"transformation: the base config's method is {base.method!r}; only methods that "
            "learn a transformation (fct) have one to sweep"
        )
    for key in (s.key for s in sweep.space):
        if key.startswith(PREFIX) and key[len(PREFIX) :].split(".")[0] not in {
            f.name for f in dataclasses.fields(FCTSpec)
        }:
            raise ConfigError(f"space: {key!r} is not an FCTSpec key")


def check_backfill(sweep: SweepConfig) -> None:
    """``backfill.`` keys and objectives need a ``backfill`` section, which needs a
    ``transformation`` section (the backfill rewrites ``h(old)``)."""
    keys = [s.key for s in sweep.space if s.key.startswith(BACKFILL)]
    if sweep.backfill is None:
        if keys or sweep.objective in BACKFILL_OBJECTIVES:
            what = f"space keys {keys}" if keys else f"objective {sweep.objective}"
            raise ConfigError(
                f"{what} score a partial backfill: add a 'backfill:' section "
                "(PartialBackfillSpec: budget, order, target, uncertainty_weight) and a "
                "'transformation:' section to the sweep config"
            )
        return
    if sweep.transformation is None:
        raise ConfigError(
            "backfill: a partial backfill rewrites h(old); add a 'transformation:' section "
            "(an FCT sweep) too"
        )
    names = {f.name for f in dataclasses.fields(PartialBackfillSpec)}
    for key in keys:
        if key[len(BACKFILL) :] not in names:
            raise ConfigError(f"space: {key!r} is not a PartialBackfillSpec key")


def backfill_metrics(evaluation: dict) -> dict:
    """A trial's ``backfill_*`` metrics from a validation :func:`backfill_evaluation`, in the
    uncertainty order (FastFill's) unless said: ``backfill_auc`` (top-1 area over [0, 1]),
    ``backfill_auc_mean_ap``, ``backfill_top1_at_budget``, ``backfill_budget_for_target``
    (NaN when no grid point reaches it) and ``backfill_random_auc`` (the baseline's)."""
    ours, random = evaluation["summary"]["uncertainty"], evaluation["summary"]["random"]
    need = ours["budget_for_target"]
    return {
        "backfill_auc": ours["auc_top1"],
        "backfill_auc_mean_ap": ours["auc_mean_ap"],
        "backfill_top1_at_budget": ours["top1_at_budget"],
        "backfill_budget_for_target": float("nan") if need is None else need,
        "backfill_random_auc": random["auc_top1"],
    }


def transformed_val_matrix(
    cfg: TrainConfig,
    result,
    spec: FCTSpec,
    run: RunSpec,
    work_dir: str,
    backfill: PartialBackfillSpec | None = None,
) -> tuple[CompatibilityMatrix, dict]:
    """Learn ``h`` between the run's last two models and return the validation matrix with
    ``M(T, T-1)`` replaced by ``M(T, h(T-1))``, and the trial's extra metrics: the stored
    ``M(T, T-1)`` as ``stored_cross_test`` and, with ``backfill``, the validation backfill
    curve's :func:`backfill_metrics` (``h`` then learns its uncertainty)."""
    from raycompat.cluster.train.driver import val_evaluation
    from raycompat.cluster.train.fct_fit import (
        fit_transformation,
        transform_features,
        transform_with_uncertainty,
    )
    from raycompat.train.data import make_splits, open_dataset
    from raycompat.train.export import load_features
    from raycompat.train.scenarios import plan_steps
    from raycompat.transformations import load_transformation
    from raycompat.upgrade.backfill_eval import backfill_evaluation

    matrix = result.val_matrix
    if matrix is None or len(matrix) < 2:
        raise ValueError("an FCT sweep needs two models and a validation split")
    old_name, new_name = matrix.names[-2:]
    plan = next(p for p in plan_steps(cfg) if p.name == new_name)
    dataset = open_dataset(cfg.data)
    labels = dataset.labels
    splits = make_splits(cfg, labels)
    rows = splits.train[np.isin(labels[splits.train], plan.seen_classes)]
    with (
        result.checkpoints[old_name].as_directory() as old_dir,
        result.checkpoints[new_name].as_directory() as new_dir,
    ):
        h_dir = fit_transformation(
            old_dir,
            new_dir,
            dataset,
            rows,
            spec,
            scaling=cfg.scaling,
            run=run,
            work_dir=os.path.join(work_dir, run.name),
            seed=cfg.seed,
            uncertainty=backfill is not None,
            discriminative_weight=0.0 if backfill is None else backfill.uncertainty_weight,
        )
        old_val, new_val = load_features(old_dir, "val"), load_features(new_dir, "val")
    h = load_transformation(h_dir)
    protocol, eval_set, distance = val_evaluation(cfg, labels, splits)
    extra = {}
    if backfill is None:
        transformed = transform_features(h, old_val)
    else:  # the validation images, never the test split
        transformed, uncertainty = transform_with_uncertainty(h, old_val)
        evaluation = backfill_evaluation(
            new_val, transformed, uncertainty, eval_set.labels, backfill, distance=distance
        )
        extra = backfill_metrics(evaluation)
    values = matrix.as_array().copy()
    extra["stored_cross_test"] = float(values[-1, -2])
    values[-1, -2] = score(protocol, new_val, transformed, eval_set, distance)
    out = CompatibilityMatrix.from_array(values, names=list(matrix.names), metric=matrix.metric)
    return out, extra
