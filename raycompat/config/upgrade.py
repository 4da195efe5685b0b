"""Typed config of ``jobs/upgrade.py`` (YAML -> dataclasses; unknown keys are errors).

An :class:`UpgradeConfig` names a gallery store and an ordered history of model upgrades. Each
entry of ``upgrades`` is one model version; the job runs the entries in order and skips what an
earlier run already published, so a config may describe one upgrade or a whole history. The
first entry of an empty store is the initial model: it is trained, and the gallery is extracted
with it. The defaults are the embedded MNIST-5k history that ``python jobs/upgrade.py`` runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from raycompat.config import bounded, check_ranges
from raycompat.config.fct import FCTSpec, PartialBackfillSpec  # Ray-free, for sweeps
from raycompat.config.pipelines import RunOptions, SourceSpec, StoreSpec
from raycompat.config.train import (
    DataSpec,
    EvalSpec,
    ModelSpec,
    OptimSpec,
    RunSpec,
    ScalingSpec,
    ScenarioSpec,
    TrainConfig,
)
from raycompat.errors import ConfigError
from raycompat.methods.catalog import check_method_options, method_entry
from raycompat.registry import UnknownNameError


@dataclass
class MapSpec:
    """The fit of a ``procrustes``, ``affine``, ``adapter`` or ``slerp`` entry
    (docs/transformations.md): a seeded sample of the stored gallery's rows, each re-embedded
    by the new model from the gallery's images on the workers (``cluster/pipelines/pairs.py``):
    about ``pairs`` rows (default :data:`DEFAULT_PAIRS`), or the share ``pairs_fraction`` of
    them (one of the two).
    ``lam``: the affine fit's orthogonality penalty (0: plain least squares). ``direction``:
    ``query`` maps the new model's queries into the stored gallery's space (nothing is
    rewritten); ``gallery`` maps the stored gallery forward into the new model's space, written
    as a new version by the transform pipeline as FCT's h is."""

    pairs: int | None = bounded(None, ge=2)
    pairs_fraction: float | None = bounded(None, gt=0.0, le=1.0)
    lam: float = bounded(0.0, ge=0.0)
    direction: Literal["query", "gallery"] = "query"

    def budget(self) -> dict[str, float]:
        """The sample's size as ``sample_pair_statistics`` takes it: ``{"fraction": f}`` or
        ``{"pairs": n}``."""
        if self.pairs_fraction is not None:
            return {"fraction": self.pairs_fraction}
        return {"pairs": DEFAULT_PAIRS if self.pairs is None else self.pairs}

    def describe(self) -> str:
        """The budget in a log line: ``5000 pairs`` or ``a 1% sample of the rows``."""
        if self.pairs_fraction is not None:
            return f"a {100 * self.pairs_fraction:.4g}% sample of the rows"
        return f"{self.budget()['pairs']} pairs"


DEFAULT_PAIRS = 5000


@dataclass
class UpgradeSpec:
    """One model version of the history.

    Attributes:
        model_version: the name the model is registered under (``m2``).
        classes: the model trains on dataset classes ``[0, classes)`` (the growing data).
        method: a registered compatibility method; ``fct`` (or any method whose
            ``needs_transformation`` is set) upgrades by transforming the gallery.
        gallery_version: the version this entry writes if it writes one (the initial
            extraction, an FCT transformation or a backfill); default ``v<position>``.
        baselines: methods trained beside this one on the same data for the report only (never
            published), e.g. ``[ift]`` to show what incompatible fine-tuning does.
        partial_backfill: FCT methods only: publish ``h(current)`` with a fraction of the rows
            re-extracted (:class:`PartialBackfillSpec`) instead of ``h(current)`` alone; ``h``
            then learns its uncertainty too.
        map: ``procrustes``, ``affine``, ``adapter`` and ``slerp`` entries (upgrades without
            compatible training): how the query map is fitted (:class:`MapSpec`).
    """

    model_version: str
    classes: int = bounded(ge=1)  # at most training.model.num_classes (check_upgrade_config)
    method: str = "cores"
    method_options: dict = field(default_factory=dict)
    epochs: int | None = bounded(None, ge=1)  # None: training.epochs
    gallery_version: str = ""
    baselines: list[str] = field(default_factory=list)
    fct: FCTSpec = field(default_factory=FCTSpec)
    partial_backfill: PartialBackfillSpec | None = None
    map: MapSpec = field(default_factory=MapSpec)


@dataclass
class PolicySpec:
    """What to do when an upgrade is neither backward-compatible nor forward-transformable.

    ``refuse`` (default) publishes nothing; ``backfill`` re-extracts the whole gallery with the
    new model into a new version (the expensive path compatibility exists to avoid);
    ``partial_backfill`` (FCT upgrades only; others are refused) writes ``h(current)`` with the
    fraction ``partial_backfill.budget`` of its rows re-extracted, most uncertain first.

    ``max_negative_flip_rate``: refuse an upgrade whose negative-flip rate (the fraction of
    the test queries the old system answered right at top-1 and the upgraded one answers
    wrong, on the gallery the action would serve; identification protocol) is above it, in
    [0, 1]; None (default): no gate.
    """

    on_incompatible: Literal["refuse", "backfill", "partial_backfill"] = "refuse"
    partial_backfill: PartialBackfillSpec = field(
        default_factory=lambda: PartialBackfillSpec(budget=0.3)
    )
    max_negative_flip_rate: float | None = bounded(None, ge=0.0, le=1.0)


def partial_backfill_of(spec: UpgradeSpec, policy: PolicySpec) -> PartialBackfillSpec | None:
    """The partial backfill an FCT entry may take: its own, else the policy's when the policy
    allows one; None when neither."""
    if spec.partial_backfill is not None:
        return spec.partial_backfill
    return policy.partial_backfill if policy.on_incompatible == "partial_backfill" else None


def _mnist_training() -> TrainConfig:
    """LeNet++ with a d-Simplex head on MNIST-5k: CoReS' toy setting (sec. 5)."""
    return TrainConfig(
        model=ModelSpec(backbone="lenetpp", head="dsimplex", num_classes=10),
        data=DataSpec(name="mnist5k"),
        # open-set: digits 7-9 are never trained on; every model is scored on them
        eval=EvalSpec(
            protocol="identification", split="open_set", test_classes=[7, 8, 9], val_fraction=0.1
        ),
        optim=OptimSpec(name="adam", lr=0.002, weight_decay=0.0, schedule="constant"),
        scaling=ScalingSpec(num_workers=1, cpus_per_worker=1.0),
        run=RunSpec(name="", storage_path="outputs/upgrade/runs", checkpoints_to_keep=1),
        epochs=2,
        batch_size=64,
    )


def _mnist_history() -> list[UpgradeSpec]:
    return [
        UpgradeSpec(model_version="m1", classes=5, method="independent"),
        UpgradeSpec(
            model_version="m2",
            classes=6,
            method="dsimplex_hoc",
            method_options={"lam": 0.1, "rho": 5.0},
            baselines=["ift"],
        ),
        UpgradeSpec(
            model_version="m3",
            classes=7,
            method="fct",
            partial_backfill=PartialBackfillSpec(budget=0.3, order="uncertainty"),
        ),
    ]


@dataclass
class UpgradeConfig:
    """The store, the training setup shared by every upgrade, and the upgrade history.

    ``training`` is a :class:`~raycompat.config.train.TrainConfig` whose ``method``,
    ``scenario`` and ``run.name`` are set per upgrade; its data, splits and evaluation protocol
    are shared, so every model is scored on the same test images.
    """

    name: str = "mnist-history"  # stable: rerunning the same name resumes or no-ops
    store: StoreSpec = field(
        default_factory=lambda: StoreSpec(root="outputs/upgrade/store", gallery="mnist")
    )
    gallery_images: SourceSpec = field(default_factory=SourceSpec)  # what the gallery holds
    normalized: bool = True  # gallery rows L2-normalised (cosine search)
    training: TrainConfig = field(default_factory=_mnist_training)
    upgrades: list[UpgradeSpec] = field(default_factory=_mnist_history)
    policy: PolicySpec = field(default_factory=PolicySpec)
    pipeline: RunOptions = field(
        default_factory=lambda: RunOptions(rows_per_file=2500, batch_size=500, actors=2)
    )
    report_dir: str = "outputs/upgrade/report"  # the report goes to <report_dir>/<name>/
    work_dir: str = "outputs/upgrade/work"  # local scratch: model copies, triples, features
    ray_address: str | None = None


def check_upgrade_config(cfg: UpgradeConfig) -> None:
    """Everything that can be checked without data, torch or Ray: names, methods, classes,
    options, splits, weights files, budgets. Methods are looked up in the torch-free catalogue
    (:mod:`raycompat.methods.catalog`), so a typo is one line in well under a second."""
    from raycompat.config.checks import check_eval_split, check_unseen, check_weight_files
    from raycompat.store.paths import check_name

    check_ranges(cfg)  # again, for a config built in Python rather than loaded
    for key in ("root", "gallery"):
        if not getattr(cfg.store, key):
            raise ConfigError(f"store.{key} must be set")
    check_name("gallery", cfg.store.gallery)
    check_name("run", cfg.name)
    if not cfg.upgrades:
        raise ConfigError("upgrades: the history is empty; give at least one model version")
    check_eval_split(cfg.training)
    check_weight_files(cfg.training, prefix="training.")
    k = cfg.training.model.num_classes
    seen_models, seen_versions = set(), set()
    for i, spec in enumerate(cfg.upgrades):
        key = f"upgrades[{i}]"
        check_name("model", spec.model_version)
        if spec.model_version in seen_models:
            raise ConfigError(f"{key}.model_version {spec.model_version!r} appears twice")
        seen_models.add(spec.model_version)
        version = spec.gallery_version or f"v{i + 1}"
        check_name("version", version)
        if version in seen_versions:
            raise ConfigError(f"{key}.gallery_version {version!r} appears twice")
        seen_versions.add(version)
        if not 1 <= spec.classes <= k:
            raise ConfigError(f"{key}.classes={spec.classes} must be in 1..{k} (model K)")
        check_unseen(cfg.training, list(range(spec.classes)), f"{key}.classes={spec.classes}")
        named = [("method", spec.method)]
        named += [(f"baselines[{j}]", name) for j, name in enumerate(spec.baselines)]
        for field_name, method in named:
            try:
                method_entry(method)
            except UnknownNameError as error:  # its message lists the valid names
                raise ConfigError(f"{key}.{field_name}: {error}") from None
        check_method_options(spec.method, spec.method_options, f"{key}.method_options")
        if spec.map.pairs is not None and spec.map.pairs_fraction is not None:
            raise ConfigError(
                f"{key}.map: pairs={spec.map.pairs} and pairs_fraction="
                f"{spec.map.pairs_fraction} are both set; give one"
            )
        if spec.partial_backfill is not None:
            if not method_entry(spec.method).needs_transformation:
                raise ConfigError(
                    f"{key}.partial_backfill: method {spec.method!r} learns no transformation; "
                    "a partial backfill rewrites h(gallery), so it needs an FCT method (fct)"
                )
            check_partial_backfill(spec.partial_backfill, f"{key}.partial_backfill")
    check_partial_backfill(cfg.policy.partial_backfill, "policy.partial_backfill")


def check_partial_backfill(spec: PartialBackfillSpec, key: str) -> None:
    """Budget and weights of a config built in Python (loaded ones are range-checked already)."""
    import math

    from raycompat.config.checks import check_budget

    check_budget(spec.budget, f"{key}.budget")
    if not math.isfinite(spec.uncertainty_weight):
        raise ConfigError(f"{key}.uncertainty_weight must be finite, got {spec.uncertainty_weight}")


def gallery_version_of(cfg: UpgradeConfig, position: int) -> str:
    return cfg.upgrades[position].gallery_version or f"v{position + 1}"


def history_from_training(cfg: TrainConfig, name: str, fct: FCTSpec | None = None) -> UpgradeConfig:
    """The upgrade history that replays a training scenario through ``jobs/upgrade.py``.

    Each model of the scenario becomes one upgrade trained on every class seen so far: CoReS
    and two-model tasks are already cumulative, CL2R tasks are summed. The first model uses
    ``first_method``, the others ``method`` with its options (a sweep's best values). The
    upgrade job trains each model against the gallery's model on all of its classes, so CL2R's
    replay-buffer restriction does not carry over. Replacements and given old models are
    refused (they have no history equivalent yet). ``fct``: how FCT upgrades learn ``h``
    (default :class:`FCTSpec`).
    """
    scenario = cfg.scenario
    if scenario.replacements or scenario.old_model is not None:
        raise ConfigError(
            "scenario.replacements / scenario.old_model have no upgrade-history equivalent; "
            "write the upgrades list by hand"
        )
    classes = list(scenario.tasks)
    if scenario.kind in ("cl2r", "iam_cl2r"):
        classes = [sum(classes[: i + 1]) for i in range(len(classes))]
    upgrades = [UpgradeSpec(model_version="m1", classes=classes[0], method=cfg.first_method)]
    upgrades += [
        UpgradeSpec(
            model_version=f"m{i + 1}",
            classes=c,
            method=cfg.method,
            method_options=dict(cfg.method_options),
            fct=dataclasses.replace(fct) if fct is not None else FCTSpec(),
        )
        for i, c in enumerate(classes[1:], start=1)
    ]
    training = dataclasses.replace(cfg, scenario=ScenarioSpec())  # set per upgrade
    return UpgradeConfig(
        name=name,
        store=StoreSpec(root=f"outputs/upgrade/stores/{name}", gallery="gallery"),
        gallery_images=SourceSpec(kind="dataset", name=cfg.data.name, options=cfg.data.options),
        training=training,
        upgrades=upgrades,
    )


def decision_digest(cfg: UpgradeConfig, spec: UpgradeSpec, against: str | None) -> str:
    """What an entry is judged under: the entry, the shared training config, the policy and
    the gallery model it is compared with (credentials redacted, paths of runs excluded). A
    refused or failed entry is skipped on rerun while this is unchanged."""
    import hashlib
    import json

    from raycompat.config import to_dict
    from raycompat.io.credentials import redact

    training = to_dict(cfg.training)
    training.pop("run", None)  # where runs are kept does not change what is trained
    if cfg.training.stop.rule == "cap":  # decisions made before the stopping rule keep theirs
        del training["stop"]
    if cfg.training.data.decode_actors is None:  # as those made before data.decode_actors
        del training["data"]["decode_actors"]
    entry = to_dict(spec)
    if not method_entry(spec.method).fits_map:  # entries written before maps keep their digest
        del entry["map"]
    elif spec.map.pairs_fraction is None:  # as before pairs_fraction: the pairs, default filled
        entry["map"] = {**entry["map"], **spec.map.budget()}
        del entry["map"]["pairs_fraction"]
    content = {
        "entry": entry,
        "training": redact(training),
        "policy": _policy_digest(cfg.policy),
        "gallery_images": redact(to_dict(cfg.gallery_images)),
        "against": against,
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def _policy_digest(policy: PolicySpec) -> dict:
    """The policy as the digest sees it: without the NFR gate while it is unset, so that the
    configs written before the gate existed keep their digests (and standing decisions)."""
    from raycompat.config import to_dict

    out = to_dict(policy)
    if out["max_negative_flip_rate"] is None:
        del out["max_negative_flip_rate"]
    return out
