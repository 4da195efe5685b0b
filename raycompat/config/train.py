"""Typed training configuration (YAML -> dataclasses; unknown keys and wrong types are errors).

One :class:`TrainConfig` describes a whole scenario: every model of the sequence, how each is
trained and evaluated, and how Ray runs it. See ``configs/train_*.yaml`` for complete examples
and :mod:`raycompat.train.scenarios` for what each scenario does with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from raycompat.config import bounded
from raycompat.errors import ConfigError
from raycompat.io.s3_options import with_endpoint

_SPLITS = ("closed_set", "open_set")


@dataclass
class ModelSpec:
    """Backbone + head. ``num_classes`` is K, the pre-allocated outputs (d-Simplex: d = K - 1)."""

    backbone: str = "lenetpp"
    head: str = "dsimplex"
    num_classes: int = bounded(10, ge=1)
    embed_dim: int | None = bounded(None, ge=1)
    backbone_kwargs: dict = field(default_factory=dict)
    head_kwargs: dict = field(default_factory=dict)
    weights: str | None = None  # local or s3:// initial weights (e.g. a pre-trained DINOv3)


@dataclass
class DataSpec:
    """A registered dataset (:data:`raycompat.data.DATASETS`) and how workers read it."""

    name: str = "mnist5k"
    options: dict = field(default_factory=dict)  # keyword arguments of the dataset builder
    augment: str = "none"  # AUGMENTATIONS: none | flip | crop_flip
    loader: Literal["sampler", "ray_data"] = "sampler"
    # DataLoader processes per training worker, decoding its batches (loader: sampler) and the
    # images it extracts features of (either loader); 0: in the training process; None: all
    # the worker's CPUs but one (scaling.cpus_per_worker - 1)
    num_loader_workers: int | None = bounded(None, ge=0)
    # loader: ray_data only: Ray Data decode actors (1 CPU each) in the cluster's one pool, in
    # front of every training worker; None: one per CPU the training workers do not hold
    decode_actors: int | None = bounded(None, ge=1)


@dataclass
class EvalSpec:
    """How every model is scored against every earlier one (REFERENCE.md protocols)."""

    # The metric. A value of ``split`` here is a common slip: the error says where it goes.
    protocol: Literal["identification", "verification", "templates"] = field(
        default="identification",
        metadata={"hints": {s: f"for {s} evaluation set eval.split: {s}" for s in _SPLITS}},
    )
    # Which test images (docs/training.md "Evaluation protocols"): ``closed_set`` holds out
    # ``test_fraction`` of every class's images, so the test classes are classes the models
    # trained on; ``open_set`` holds out every image of ``test_classes`` and no model of the
    # sequence may train on them (identities the service never saw, as in face search).
    split: Literal["closed_set", "open_set"] = "closed_set"
    test_classes: list[int] = field(default_factory=list)  # open_set only
    dataset: DataSpec | None = None  # None: a held-out split of the training data
    # closed_set: held out of every class when ``dataset`` is None
    test_fraction: float = bounded(0.2, gt=0.0, lt=1.0)
    # held out of the training data for model selection; 0: no validation split
    val_fraction: float = bounded(0.1, ge=0.0, lt=1.0)
    distance: str = "cosine"
    # verification: positive and negative pairs each, when not given
    pairs: int = bounded(3000, ge=1)
    strict_ecc: bool = True
    # images per forward pass when a worker (or the upgrade job's driver) extracts validation
    # and test features; bounds memory only, never a score
    batch_size: int = bounded(256, ge=1)


@dataclass
class OptimSpec:
    """The optimizer and learning-rate schedule of every training run
    (:func:`raycompat.train.schedule.lr_at`): a scenario's models, per epoch, and FCT's pieces,
    per step (with FCT's defaults: :class:`raycompat.config.fct.FCTOptimSpec`)."""

    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = bounded(0.1, gt=0.0)
    momentum: float = bounded(0.9, ge=0.0, lt=1.0)  # sgd only
    weight_decay: float = bounded(5e-4, ge=0.0)
    schedule: Literal["constant", "step", "cosine"] = "step"
    milestones: list[int] = field(default_factory=list)  # epochs where lr *= gamma ("step")
    gamma: float = bounded(0.1, gt=0.0)
    warmup_epochs: int = bounded(0, ge=0)
    # Clip the total gradient 2-norm to this before each optimizer step; None: no clipping.
    clip_grad_norm: float | None = bounded(None, gt=0.0)


@dataclass
class StopSpec:
    """When a model's training ends (:mod:`raycompat.train.stopping`): ``cap`` trains every one of
    ``epochs``; ``plateau`` trains to convergence, ending once the validation score (top-1 of the
    training classes' held-out images, ``eval.val_fraction``; ECC-gated under CoReS model
    selection) has not improved by more than ``min_delta`` for ``patience`` epochs, with
    ``epochs`` as the cap; the best epoch is the one kept."""

    rule: Literal["cap", "plateau"] = "cap"
    patience: int = bounded(3, ge=1)
    min_delta: float = bounded(0.0, ge=0.0)
    min_epochs: int = bounded(1, ge=1)


@dataclass
class ReplacementSpec:
    """IAM-CL2R: before fine-tuning task ``at_task``, replace the model by an improved one."""

    at_task: int = bounded(ge=0)
    model: ModelSpec = field(default_factory=ModelSpec)
    pretrain_classes: list[int] = field(default_factory=list)  # trained from scratch on these
    # None: the run's epochs; 0 with model.weights: use them as is
    epochs: int | None = bounded(None, ge=0)


@dataclass
class OldModelSpec:
    """Two-model upgrade: the model already serving the gallery."""

    checkpoint: str = ""  # a raycompat model directory or a weights file (local or s3://)
    model: ModelSpec = field(default_factory=ModelSpec)
    classes: int = bounded(0, ge=0)  # the old model was trained on classes [0, classes)
    access: Literal["with_classifier", "features_only", "black_box"] = "with_classifier"


@dataclass
class ScenarioSpec:
    kind: Literal["cores", "cl2r", "iam_cl2r", "two_model"] = "cores"
    # cores: classes seen by each step (union, growing); cl2r/iam_cl2r: classes per task;
    # two_model: [old classes, new classes].
    tasks: list[int] = field(default_factory=lambda: [4, 7, 10])
    replay_per_class: int = bounded(20, ge=0)  # 0: no replay buffer
    replacements: list[ReplacementSpec] = field(default_factory=list)
    old_model: OldModelSpec | None = None
    model_selection: bool = False


@dataclass
class ScalingSpec:
    num_workers: int = bounded(2, ge=1)
    use_gpu: bool = False
    cpus_per_worker: float = bounded(1.0, ge=0.0)
    strategy: str = "ddp"  # STRATEGIES: ddp | fsdp | deepspeed
    strategy_options: dict = field(default_factory=dict)
    precision: Literal["fp32", "bf16"] = "bf16"  # on GPU only: raycompat.precision
    channels_last: bool = True  # for convolutional backbones on GPU
    # Ray's placement of the workers' bundles; SPREAD puts them on different nodes if it can
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    # One worker with the ddp strategy trains in one Ray task ("task"), without Ray Train's
    # worker group and its ~10 s start-up (raycompat/cluster/train/task_run.py); "ray_train"
    # keeps it on Ray Train. Runs with Ray Data shards or a sweep's callbacks always use Ray Train.
    one_worker_runner: Literal["task", "ray_train"] = "task"


@dataclass
class FailurePoint:
    """Test hook at (step, epoch, batch) in worker ``rank``, 0-based. ``error``: raise once (a
    marker in the run folder survives the restart). ``nan`` (scenario training loop only): make
    that batch's loss NaN on every attempt, as a diverging run would (each hit leaves its own
    marker, so tests count attempts).
    """

    step: int = bounded(0, ge=0)
    epoch: int = bounded(0, ge=0)
    batch: int = bounded(0, ge=0)
    rank: int = bounded(0, ge=0)
    kind: Literal["error", "nan"] = "error"


@dataclass
class RunSpec:
    name: str = "mnist-cores"  # stable: rerunning the same name resumes the run
    storage_path: str = "outputs/runs"  # local path or s3://bucket/prefix
    # s3fs options, as the store's (raycompat.io.s3_options): key/secret/token, client_kwargs:
    # {endpoint_url: ...} for an S3-compatible store; what is absent comes from the env.
    storage_options: dict = field(default_factory=dict)
    endpoint_url: str | None = None  # deprecated: storage_options.client_kwargs.endpoint_url
    # Restarts after a worker error (-1: unlimited); a non-finite step is never retried.
    max_failures: int = bounded(2, ge=-1)
    checkpoints_to_keep: int = bounded(2, ge=1)
    # Seconds between Ray Train's collections of the workers' reports. A worker's next report
    # waits until its last one is collected, so Ray's own 2 s held every epoch up to 2 s; each
    # collection is one call per worker: raise it for runs of hundreds of workers.
    report_poll_s: float = bounded(0.25, gt=0.0, le=60.0)
    inject_failure: FailurePoint | None = None

    def __post_init__(self) -> None:
        self.storage_options = with_endpoint("run.", self.storage_options, self.endpoint_url)
        self.endpoint_url = None


@dataclass
class TrainConfig:
    method: str = "cores"  # METHODS registry
    method_options: dict = field(default_factory=dict)
    first_method: str = "independent"  # the first model has nothing to be compatible with
    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataSpec = field(default_factory=DataSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    scenario: ScenarioSpec = field(default_factory=ScenarioSpec)
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    run: RunSpec = field(default_factory=RunSpec)
    # epochs 0 would publish a gallery extracted by an untrained model. With stop.rule plateau,
    # a cap: training ends at the validation plateau.
    epochs: int = bounded(4, ge=1)
    stop: StopSpec = field(default_factory=StopSpec)
    # images per optimizer step over all workers together (replayed images included); each
    # worker steps on batch_size // scaling.num_workers of them
    batch_size: int = bounded(64, ge=1)
    seed: int = bounded(0, ge=0)

    def __post_init__(self) -> None:
        if self.stop.rule == "plateau" and self.eval.val_fraction == 0:
            raise ConfigError(
                "stop.rule: plateau stops on the validation split: set eval.val_fraction > 0 "
                "(never the test split)"
            )
