"""Typed sweep configuration: a base training config plus a search space, objective and budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from raycompat.config.fct import FCTSpec, PartialBackfillSpec
from raycompat.io.s3_options import with_endpoint


@dataclass
class ParamSpec:
    """One dimension of the search space, addressed by its training-config key.

    ``kind``: ``grid`` (every value, crossed with the other grids), ``choice`` (sampled from
    ``values``), ``uniform`` / ``loguniform`` (floats in ``[low, high]``), ``randint``
    (integers in ``[low, high)``).
    """

    key: str  # e.g. "method_options.lam", "optim.lr", "epochs", "scenario.replay_per_class"
    kind: Literal["grid", "choice", "uniform", "loguniform", "randint"] = "grid"
    values: list[Any] = field(default_factory=list)
    low: float | None = None
    high: float | None = None


@dataclass
class ASHASpec:
    """Asynchronous successive halving on the per-epoch reports (``training_iteration``)."""

    grace_period: int = 1
    reduction_factor: int = 2
    max_t: int = 100


@dataclass
class SweepConfig:
    # What an unknown key with no near miss is told: a training key is not a sweep key.
    UNKNOWN_KEY_HINT: ClassVar[str] = (
        "; a key of the training config (epochs, optim.lr, ...) goes in overrides, applied to "
        "base for every trial: overrides=[epochs=2]"
    )
    base: str = "configs/train_mnist_cores.yaml"  # a jobs/train.py config
    overrides: list[str] = field(default_factory=list)  # applied to base for every trial
    space: list[ParamSpec] = field(default_factory=list)
    search: Literal["grid", "random", "optuna"] = "grid"
    num_samples: int = 1  # repeats of the grid, or samples for random/optuna
    objective: Literal[
        "AC",
        "AA",
        "ACA",
        "self_test",
        "ecc_self_test",
        "update_gain",
        "cross_test",
        "backfill_auc",
        "backfill_top1_at_budget",
    ] = "ACA"
    asha: ASHASpec | None = None
    # FCT sweeps (base method fct): each trial also learns h and is scored on h(old) features;
    # its keys are searchable as "transformation.width", "transformation.optim.lr", ...
    transformation: FCTSpec | None = None
    # FCT sweeps for a partial backfill (FastFill): h also learns its uncertainty, and each
    # trial is scored on the validation backfill curve (objectives backfill_*); its keys are
    # searchable as "backfill.uncertainty_weight", "backfill.budget", ...
    backfill: PartialBackfillSpec | None = None
    max_concurrent_trials: int | None = None  # None: what the cluster's CPUs/GPUs allow
    max_failures: int = 0  # per trial; a failed trial never stops the sweep
    name: str = "sweep"
    storage_path: str = "outputs/sweeps"  # a local (or shared) folder, or s3://bucket/prefix
    # s3fs options, as run.storage_options and the store's; every trial's run uses them too
    storage_options: dict = field(default_factory=dict)
    endpoint_url: str | None = None  # deprecated: storage_options.client_kwargs.endpoint_url
    seed: int = 0

    def __post_init__(self) -> None:
        self.storage_options = with_endpoint("", self.storage_options, self.endpoint_url)
        self.endpoint_url = None
